"""Ray Data: ``materialize`` and ``convert`` as Ray tasks (public face of
:mod:`lanceloader.integrations.ray`; importing it imports Ray).
"""

from lanceloader.integrations.ray import convert, materialize

__all__ = ["convert", "materialize"]
