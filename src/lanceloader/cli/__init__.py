"""Command line: ``lanceloader demo``, ``bench``, ``inspect`` and ``convert``.

``demo`` reads a generated or given dataset in each order mode (sequential, block shuffle, full
shuffle) next to raw Lance, ``--runs`` epochs each, and prints the medians of rows/s, MB/s and
time to first batch with what each mode means, then the next commands to try. ``bench`` runs the
Loader with the given settings and a progress bar, then prints ``loader.stats()`` (a table and
the bottleneck verdict); it can also write the stats and a throughput time series as JSON, a PNG
plot and a Perfetto trace. ``inspect`` describes a dataset: versions, schema, rows, fragments,
bytes per column, and what each column becomes as a NumPy array. ``convert`` writes images,
Parquet, CSV or a saved Hugging Face dataset to Lance (:func:`lanceloader.convert`).
``ledger`` exports the rows of a range of steps; ``check-resume`` runs
:func:`lanceloader.check_resume` on a loader factory (exit status 1 at a divergence).

Bad arguments and bad input (a missing dataset, an unknown column, a bad filter, a transform that
cannot be imported) print one line on stderr and exit with code 2.

Example::

    $ lanceloader demo                 # writes ~/.cache/lanceloader/demo-300000.lance once
    $ lanceloader bench data/train.lance --shuffle --block-size 1024 --json stats.json
    $ lanceloader inspect data/train.lance

Each command lives in its own module (``demo.py``, ``bench.py``, ``inspect.py``, ``convert.py``,
``ledger.py``, ``check_resume.py``); this one
holds the parser and ``main``, and ``errors.py`` the bad-input handling they share.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from lanceloader.cli import bench, bench_clips, convert, demo, inspect
from lanceloader.cli.check_resume import add_check_resume
from lanceloader.cli.errors import INPUT_ERRORS as INPUT_ERRORS
from lanceloader.cli.errors import CommandError, one_line
from lanceloader.cli.errors import input_errors as input_errors
from lanceloader.cli.inspect import INSPECT_SAMPLE_ROWS
from lanceloader.cli.ledger import add_ledger


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr (exit code 2), no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """argparse type: an int >= 1.

    >>> positive_int("3")
    3
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def image_size(text: str) -> int | tuple[int, int]:
    """argparse type: ``224`` or ``224x160`` (height x width), each >= 1.

    >>> image_size("224"), image_size("224x160")
    (224, (224, 160))
    """
    parts = text.lower().split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"must be PX or HxW with integers >= 1, e.g. 224 or 224x160; got {text!r}"
        )
    return values[0] if len(values) == 1 else (values[0], values[1])


MAIN_EPILOG = """\
examples:
  lanceloader demo
  lanceloader bench data/train.lance --shuffle --block-size 1024 --json stats.json
  lanceloader inspect data/train.lance

Run `lanceloader COMMAND --help` for the options of each command.
"""

BENCH_EPILOG = """\
examples:
  lanceloader bench data/train.lance
  lanceloader bench data/train.lance --columns image,label --shuffle --workers 8
  lanceloader bench data/train.lance --shuffle --block-size 1024 --window 8 --epochs 2
  lanceloader bench data/train.lance --splits train=0.9,val=0.1 --split val
  lanceloader bench data/images.lance --decode-images image --image-size 224 --shuffle
  lanceloader bench data/videos.lance --clips frames=16,stride=2 --batch-size 8 --shuffle
  lanceloader bench data/sounds.lance --audio seconds=2,sample_rate=16000 --batch-size 32
  lanceloader bench data/train.lance --transform mytransforms:decode --max-batches 200 \\
      --json stats.json --plot stats.png --trace trace.json

--json writes loader.stats().to_dict(), the stats of each epoch and a throughput series;
--plot (needs matplotlib) draws throughput over time and time per stage; --trace writes a
Perfetto / chrome://tracing file (open it at https://ui.perfetto.dev).
"""

INSPECT_EPILOG = """\
examples:
  lanceloader inspect data/train.lance
  lanceloader inspect data/train.lance --version 3 --sample-rows 100
"""


def add_bench(sub: Any) -> None:
    b = sub.add_parser(
        "bench",
        help="run the loader with the given settings and report its stats",
        description="Run the Loader with a progress bar, then print loader.stats(): throughput,\n"
        "storage I/O, time per stage and the bottleneck verdict.",
        epilog=BENCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("uri", help="a Lance dataset (local path or object store URI)")
    b.add_argument("--columns", metavar="A,B", help="comma-separated columns to read; default all")
    b.add_argument("--filter", metavar="SQL", help='SQL predicate, e.g. "label < 3"')
    b.add_argument("--batch-size", type=positive_int, default=256, metavar="N", help="default 256")
    b.add_argument("--shuffle", action="store_true", help="shuffle (default: dataset order)")
    b.add_argument(
        "--block-size",
        type=positive_int,
        metavar="K",
        help="rows read together when shuffling; default 1 (a full shuffle)",
    )
    b.add_argument(
        "--window", type=positive_int, metavar="W", help="blocks mixed together; default 8"
    )
    b.add_argument("--seed", type=int, default=0, metavar="S", help="shuffle seed; default 0")
    b.add_argument(
        "--workers", type=positive_int, metavar="N", help="worker count; default one per core"
    )
    b.add_argument("--worker-type", choices=("thread", "process"), default="thread")
    b.add_argument(
        "--rows-per-read",
        type=positive_int,
        metavar="N",
        help="rows fetched by one Lance call (one worker task); default by order",
    )
    b.add_argument(
        "--prefetch",
        type=positive_int,
        metavar="N",
        help="batches prepared ahead; default 2 x workers",
    )
    b.add_argument(
        "--splits",
        metavar="NAME=FRACTION,...",
        help="deterministic named splits of the rows, e.g. train=0.9,val=0.1; with --split",
    )
    b.add_argument("--split", metavar="NAME", help="the split to read, one of --splits")
    b.add_argument(
        "--split-key",
        metavar="COLUMN",
        help="column whose value decides a row's split; default the row offset",
    )
    b.add_argument("--output", choices=("numpy", "torch", "arrow", "python"), default="numpy")
    b.add_argument(
        "--decode-images",
        metavar="COLUMN",
        help="decode the JPEG/PNG bytes of COLUMN into a uint8 [n, H, W, 3] array "
        "(lanceloader.decode_images), before any --transform",
    )
    b.add_argument(
        "--image-size",
        type=image_size,
        metavar="PX|HxW",
        help="with --decode-images: resize every image to PX x PX or H x W pixels; needed when "
        "the images' sizes differ",
    )
    b.add_argument(
        "--transform",
        metavar="MODULE:FUNCTION",
        help="a batch transform to import, e.g. mytransforms:decode",
    )
    b.add_argument("--epochs", type=positive_int, default=1, metavar="N", help="default 1")
    b.add_argument(
        "--max-batches", type=positive_int, metavar="N", help="stop each epoch after N batches"
    )
    b.add_argument("--json", metavar="PATH", help="write the stats and a throughput series")
    b.add_argument("--plot", metavar="PATH", help="write a PNG plot (needs matplotlib)")
    b.add_argument("--trace", metavar="PATH", help="write a Perfetto / Chrome trace")
    bench_clips.add_clip_options(b)  # --clips, --audio: clips/s through the Loader
    b.set_defaults(run=bench.bench)


def add_inspect(sub: Any) -> None:
    i = sub.add_parser(
        "inspect",
        help="describe a dataset: versions, schema, rows, fragments, bytes, tensors",
        description="Describe a Lance dataset: versions, rows, fragments, bytes per column, and\n"
        "what each column becomes as a NumPy array (tried on the first rows).",
        epilog=INSPECT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    i.add_argument("uri", help="a Lance dataset (local path or object store URI)")
    i.add_argument("--version", metavar="V", help="version number or tag; default the latest")
    i.add_argument(
        "--sample-rows",
        type=positive_int,
        default=INSPECT_SAMPLE_ROWS,
        metavar="N",
        help=f"rows converted to check each column; default {INSPECT_SAMPLE_ROWS}",
    )
    i.set_defaults(run=inspect.inspect)


CONVERT_EPILOG = """\
examples:
  lanceloader convert images/train data/train.lance        # ImageFolder: root/<class>/<image>
  lanceloader convert parquet_dir/ data/table.lance
  lanceloader convert data.csv data/table.lance --mode append
  lanceloader convert hf_saved/ data/hf.lance               # a datasets.save_to_disk directory
  lanceloader convert videos/ data/videos.lance --labels labels.csv   # MP4s and their labels
"""


def add_convert(sub: Any) -> None:
    c = sub.add_parser(
        "convert",
        help="write images, videos, audio, Parquet, CSV or a saved Hugging Face dataset to Lance",
        description="Stream a source into a new Lance dataset: a folder of images in the\n"
        "ImageFolder layout, a folder of videos or of audio files (a blob column and a\n"
        "keyframe index), Parquet or CSV files (or a directory of them), or a directory\n"
        "written by datasets' save_to_disk.",
        epilog=CONVERT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument(
        "source",
        help="the images', videos' or audio files' root folder, a file, or a directory of files",
    )
    c.add_argument("out", help="the Lance dataset to write (local path or object store URI)")
    c.add_argument("--mode", choices=("create", "overwrite", "append"), default="create")
    c.add_argument(
        "--on-error",
        choices=("skip", "raise"),
        default="skip",
        help="an unreadable image: skip and list it (default), or stop",
    )
    c.add_argument(
        "--resize",
        type=positive_int,
        metavar="PX",
        help="re-encode images as JPEG with the longer side at most PX pixels",
    )
    c.add_argument(
        "--check-images",
        choices=("structure", "decode", "none"),
        default="structure",
        help="how each image is checked before it is stored: its JPEG/PNG structure "
        "(default), a full decode (slower), or not at all",
    )
    c.add_argument(
        "--labels",
        metavar="FILE",
        help="a folder of videos or audio files: a CSV or JSON file of labels and "
        "metadata, one row per file (its path or file name column names it)",
    )
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.set_defaults(run=convert.convert)


def parser() -> argparse.ArgumentParser:
    """The ``lanceloader`` argument parser with its subcommands."""
    p = OneLineParser(
        prog="lanceloader",
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Feed training loops from Lance datasets: try the loader (demo), measure it\n"
        "with your settings (bench), or look at a dataset (inspect).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="load a dataset in each order mode and report the speed")
    d.add_argument("uri", nargs="?", help="a Lance dataset; default: a generated demo dataset")
    d.add_argument("--batch-size", type=positive_int, default=256)
    d.add_argument(
        "--rows", type=positive_int, default=300_000, help="rows of the generated dataset"
    )
    d.add_argument(
        "--runs",
        type=positive_int,
        default=3,
        help="epochs per mode; the table shows medians (default 3)",
    )
    d.add_argument(
        "--workers", type=positive_int, default=None, help="thread workers (default: one per core)"
    )
    d.set_defaults(run=demo.demo)
    add_bench(sub)
    add_inspect(sub)
    add_convert(sub)
    add_ledger(sub)
    add_check_resume(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; bad arguments or input print one line on stderr and return 2."""
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except CommandError as exc:
        print(f"lanceloader {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
