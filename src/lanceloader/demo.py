"""The demo dataset (public face of :mod:`lanceloader.write.demo`).

>>> from lanceloader.demo import write_demo_dataset
"""

from lanceloader.write.demo import cached_demo_dataset, demo_table, write_demo_dataset

__all__ = ["cached_demo_dataset", "demo_table", "write_demo_dataset"]
