"""``lanceloader ledger``: the rows a range of steps read, from a saved loader state, written
as JSON lines or CSV (one line per row of each batch; :data:`lanceloader.ledger.LEDGER_SCHEMA`).

Nothing is replayed and no data is read: the rows are computed from the state's dataset
version, filter, split, packing and order (:class:`lanceloader.Ledger`). A mix's state names its
sources by identity only, so a mix's ledger is made in Python from its Loader.

Example::

    $ lanceloader ledger ckpt/loader.json --steps 12000:12010 --out spike.jsonl
    $ lanceloader ledger ckpt/loader.json --epoch 3 --steps 5 --rank 1 --out step5.csv
    $ lanceloader ledger latest.json --resumed-from ckpt1/loader.json ckpt2/loader.json \\
          --steps 0:100
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import sys
from collections.abc import Iterator
from typing import IO, Any

import pyarrow as pa

from lanceloader.cli.errors import CommandError, input_errors
from lanceloader.ledger import Ledger
from lanceloader.state.format import load_state

LEDGER_EPILOG = """\
examples:
  lanceloader ledger ckpt/loader.json --steps 12000:12010 --out spike.jsonl
  lanceloader ledger ckpt/loader.json --epoch 3 --steps 5 --rank 1 --out step5.csv
  lanceloader ledger latest.json --resumed-from ckpt1/loader.json ckpt2/loader.json --steps 0:100

STATE is a loader state saved with ll.save_state (JSON). --steps counts the run's steps from its
start (across epochs) unless --epoch is given; A:B is steps A to B-1. After a resume that changed
the number of ranks or the batch size, give the states the run resumed from (oldest first).
Each line: epoch, step, global_step, rank, index, sample, source, source_epoch, source_sample,
uri, version, position, row_offset, row_id, and for packed rows document_offsets, document_ids,
token_starts, token_counts (lists; in CSV as JSON).
"""


def step_range(text: str) -> range:
    """argparse type: ``"A:B"`` (steps A to B-1) or ``"A"`` (one step).

    >>> step_range("3:6"), step_range("7")
    (range(3, 6), range(7, 8))
    """
    try:
        first, _, last = text.partition(":")
        steps = range(int(first), int(last) if last else int(first) + 1)
    except ValueError:
        steps = range(0)
    if not steps or steps.start < 0:
        raise argparse.ArgumentTypeError(
            f"must be steps A:B with 0 <= A < B, or one step A; got {text!r}"
        )
    return steps


def whole_number(text: str) -> int:
    """argparse type: an int >= 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return int(text)


def add_ledger(sub: Any) -> None:
    """The ``ledger`` subcommand's parser."""
    p = sub.add_parser(
        "ledger",
        help="export the rows a range of steps read (from a saved state), as JSON lines or CSV",
        description="Which rows did these steps read? Computed from a saved loader state's\n"
        "dataset version and order: nothing is replayed and no data is read.",
        epilog=LEDGER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("state", help="a loader state written by ll.save_state (JSON)")
    p.add_argument(
        "--steps",
        type=step_range,
        required=True,
        metavar="A:B",
        help="steps A to B-1 (or one step A)",
    )
    p.add_argument(
        "--epoch",
        type=whole_number,
        metavar="E",
        help="count --steps within epoch E; default: the run's steps from its start",
    )
    p.add_argument("--rank", type=whole_number, metavar="R", help="one rank; default every rank")
    p.add_argument(
        "--resumed-from",
        nargs="+",
        default=[],
        metavar="STATE",
        help="the states the run resumed from, oldest first",
    )
    p.add_argument("--uri", help="the dataset's location if it moved (its identity is checked)")
    p.add_argument(
        "--format",
        choices=FORMATS,
        help="default: from --out's suffix (.csv: csv; .jsonl, .json, .ndjson: jsonl), else jsonl",
    )
    p.add_argument("--out", default="-", metavar="PATH", help="default: standard output")
    p.set_defaults(run=ledger)


def ledger(args: argparse.Namespace) -> int:
    """Write the manifest of ``args.steps``; bad input is a :class:`CommandError`."""
    fmt = output_format(args.out, args.format)
    with input_errors():
        state = read_state(args.state)
        resumed = [read_state(path) for path in args.resumed_from]
        book = Ledger.from_state(state, resumed, uri=args.uri)
        try:
            table = book.manifest(args.steps, epoch=args.epoch, rank=args.rank)
        except IndexError as exc:
            raise CommandError(str(exc)) from exc
    with output(args.out) as out:
        write_manifest(table, out, fmt)
    where = "standard output" if args.out == "-" else args.out
    print(
        f"wrote {table.num_rows} rows of steps {args.steps.start} to {args.steps.stop - 1}"
        f"{'' if args.epoch is None else f' of epoch {args.epoch}'} to {where}",
        file=sys.stderr,
    )
    return 0


FORMATS = ("jsonl", "csv")
SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}


def output_format(out: str, fmt: str | None) -> str:
    """The format to write: ``fmt`` if given, else the one ``out``'s suffix names (JSON lines for
    standard output and other suffixes); a suffix that names the other format is refused.

    >>> output_format("spike.csv", None), output_format("-", None), output_format("a.txt", "csv")
    ('csv', 'jsonl', 'csv')
    >>> output_format("spike.csv", "jsonl")
    Traceback (most recent call last):
    ...
    lanceloader.cli.errors.CommandError: --out 'spike.csv' names a CSV file but --format is jsonl: drop --format (the suffix chooses), or name the file spike.jsonl
    """
    named = SUFFIXES.get(os.path.splitext(out)[1].lower()) if out != "-" else None
    if fmt is None:
        return named or "jsonl"
    if named is not None and named != fmt:
        kind = {"csv": "a CSV file", "jsonl": "a JSON lines file"}[named]
        suffix = ".jsonl" if fmt == "jsonl" else ".csv"
        raise CommandError(
            f"--out {out!r} names {kind} but --format is {fmt}: drop --format (the suffix "
            f"chooses), or name the file {os.path.splitext(out)[0]}{suffix}"
        )
    return fmt


def read_state(path: str) -> dict[str, Any]:
    """The loader state saved at ``path``; anything else (a dataset, a folder, a binary file)
    is a :class:`CommandError` naming what a state is and how to save one."""
    how = (
        "ledger reads a loader state saved with ll.save_state(path, loader.state_dict()) "
        "(JSON, e.g. beside your model's checkpoint)"
    )
    if os.path.isdir(path):
        what = "a Lance dataset" if os.path.isdir(os.path.join(path, "_versions")) else "a folder"
        raise CommandError(f"{path!r} is {what}, not a loader state: {how}")
    try:
        return load_state(path)
    except UnicodeDecodeError as exc:
        raise CommandError(f"{path!r} is not a loader state (not text): {how}") from exc
    except ValueError as exc:
        raise CommandError(f"{exc}: {how}") from exc


@contextlib.contextmanager
def output(path: str) -> Iterator[IO[str]]:
    """The file at ``path`` (``"-"``: standard output), opened for text."""
    if path == "-":
        yield sys.stdout
        return
    try:
        f = open(path, "w", newline="")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise CommandError(f"cannot write {path!r}: {exc.strerror}") from exc
    with f:
        yield f


def write_manifest(table: pa.Table, out: IO[str], fmt: str) -> None:
    """``table`` as JSON lines (``"jsonl"``) or CSV with a header (``"csv"``; lists as JSON,
    nulls as empty cells).

    >>> import io
    >>> buf = io.StringIO()
    >>> write_manifest(pa.table({"step": [0], "token_counts": [[3, 5]]}), buf, "csv")
    >>> buf.getvalue().splitlines()
    ['step,token_counts', '0,"[3, 5]"']
    """
    rows = table.to_pylist()
    if fmt == "jsonl":
        for row in rows:
            out.write(json.dumps(row) + "\n")
        return
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.column_names)
    for row in rows:
        writer.writerow(
            ["" if v is None else json.dumps(v) if isinstance(v, list) else v for v in row.values()]
        )
