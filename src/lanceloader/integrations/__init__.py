"""Adapters for training frameworks: thin skins over Source, Order, Plan and the Loader.

Each adapter lives in its own module and imports its framework; importing ``lanceloader`` or this
package never imports torch, JAX, TensorFlow or Ray. Use the public aliases
(``import lanceloader.torch``).
"""
