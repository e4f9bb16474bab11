"""lanceloader: feed training loops from Lance datasets, fast, deterministic and resumable.

>>> import lanceloader as ll
>>> loader = ll.Loader("data/train.lance", batch_size=256, shuffle=True)   # doctest: +SKIP
>>> for batch in loader: ...                                                # doctest: +SKIP
"""

from lanceloader.batch.audio import decode_audio
from lanceloader.batch.augment import random_map
from lanceloader.batch.byterows import ByteRows
from lanceloader.batch.images import decode_images, normalise
from lanceloader.batch.output import Conversion, ConversionError
from lanceloader.batch.text import tokenize
from lanceloader.batch.transforms import TooManyRowErrors, TransformOutputError, compose, map_rows
from lanceloader.engine.live import LoaderInUseError
from lanceloader.engine.processes import WorkerDiedError
from lanceloader.engine.stalls import ActorsLostError, ActorStartError
from lanceloader.engine.stats import Stats
from lanceloader.engine.stream import EpochIterator, StallError
from lanceloader.headroom import Headroom, headroom
from lanceloader.integrations.tensorflow import as_tf_dataset
from lanceloader.ledger import Ledger
from lanceloader.loader import Loader
from lanceloader.ordering.order import Order
from lanceloader.ordering.plan import Plan
from lanceloader.ordering.schedule import Schedule
from lanceloader.resume_check import check_resume
from lanceloader.resume_report import ResumeCheckError, ResumeDivergence, ResumeReport
from lanceloader.rows.clips.index import ClipError
from lanceloader.rows.clips.source import audio_clips, video_clips
from lanceloader.rows.dataset import ReadError
from lanceloader.rows.lance.blobs import blob_files
from lanceloader.rows.lance.source import Source
from lanceloader.rows.mix import Mix
from lanceloader.rows.packing import pack
from lanceloader.rows.protocol import DatasetName, Read, RowsBase
from lanceloader.state.format import StateMismatchError, load_state, save_state
from lanceloader.write.convert import ConvertSummary, convert
from lanceloader.write.materialize import MaterializeSummary, materialize

__all__ = [
    "ActorStartError",
    "ActorsLostError",
    "ByteRows",
    "ClipError",
    "Conversion",
    "ConversionError",
    "ConvertSummary",
    "DatasetName",
    "EpochIterator",
    "Headroom",
    "Ledger",
    "Loader",
    "LoaderInUseError",
    "MaterializeSummary",
    "Mix",
    "Order",
    "Plan",
    "Read",
    "ReadError",
    "ResumeCheckError",
    "ResumeDivergence",
    "ResumeReport",
    "RowsBase",
    "Schedule",
    "Source",
    "StallError",
    "StateMismatchError",
    "Stats",
    "TooManyRowErrors",
    "TransformOutputError",
    "WorkerDiedError",
    "as_tf_dataset",
    "audio_clips",
    "blob_files",
    "check_resume",
    "compose",
    "convert",
    "decode_audio",
    "decode_images",
    "headroom",
    "load_state",
    "map_rows",
    "materialize",
    "normalise",
    "pack",
    "random_map",
    "save_state",
    "tokenize",
    "video_clips",
]
__version__ = "0.1.0"
