"""lanceloader: feed training loops from Lance datasets, fast, deterministic and resumable.

>>> import lanceloader as ll
>>> loader = ll.Loader("data/train.lance", batch_size=256, shuffle=True)   # doctest: +SKIP
>>> for batch in loader: ...                                                # doctest: +SKIP
"""

from lanceloader.convert import ConversionError
from lanceloader.loader import EpochIterator, Loader
from lanceloader.order import Order
from lanceloader.plan import Plan
from lanceloader.source import Source
from lanceloader.state import StateMismatchError, load_state, save_state

__all__ = [
    "ConversionError",
    "EpochIterator",
    "Loader",
    "Order",
    "Plan",
    "Source",
    "StateMismatchError",
    "load_state",
    "save_state",
]
__version__ = "0.1.0"
