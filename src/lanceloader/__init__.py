"""lanceloader: feed training loops from Lance datasets, fast, deterministic and resumable.

>>> import lanceloader as ll
>>> loader = ll.Loader("data/train.lance", batch_size=256, shuffle=True)   # doctest: +SKIP
>>> for batch in loader: ...                                                # doctest: +SKIP
"""

from lanceloader.augment import random_map
from lanceloader.conversion import Conversion, ConversionError
from lanceloader.engine import StallError
from lanceloader.images import decode_images, normalise
from lanceloader.ingest import ConvertSummary, convert
from lanceloader.integrations.tensorflow import as_tf_dataset
from lanceloader.loader import EpochIterator, Loader, LoaderInUseError
from lanceloader.materialize import materialize
from lanceloader.mix import Mix
from lanceloader.order import Order
from lanceloader.packing import pack
from lanceloader.plan import Plan
from lanceloader.processes import WorkerDiedError
from lanceloader.source import ReadError, Source
from lanceloader.state import StateMismatchError, load_state, save_state
from lanceloader.stats import Stats
from lanceloader.text import tokenize
from lanceloader.transforms import TooManyRowErrors, TransformOutputError, compose, map_rows

__all__ = [
    "Conversion",
    "ConversionError",
    "ConvertSummary",
    "EpochIterator",
    "Loader",
    "LoaderInUseError",
    "Mix",
    "Order",
    "Plan",
    "ReadError",
    "Source",
    "StallError",
    "StateMismatchError",
    "Stats",
    "TooManyRowErrors",
    "TransformOutputError",
    "WorkerDiedError",
    "as_tf_dataset",
    "compose",
    "convert",
    "decode_images",
    "load_state",
    "map_rows",
    "materialize",
    "normalise",
    "pack",
    "random_map",
    "save_state",
    "tokenize",
]
__version__ = "0.1.0"
