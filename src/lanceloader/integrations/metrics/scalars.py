"""The numbers a dashboard plots, from a loader's ``stats()`` or its recorder's sums.

:func:`scalars` turns two snapshots (now, and an earlier one) into the rates and shares of the
batches in between; :func:`totals_of` reads the sums straight from a Loader's recorder (half the
cost of ``stats()``), and :func:`window` subtracts two of them. Pure arithmetic: no I/O, no
clients.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from lanceloader.engine.stats import Recorder, Stats
from lanceloader.engine.verdict import cores_busy
from lanceloader.engine.waits import WAIT_KEYS, wait_percentiles

PREFIX = "lanceloader/"


def scalars(
    stats: Stats | Totals, since: Stats | Totals | None = None, prefix: str = PREFIX
) -> dict[str, float]:
    """The numbers a dashboard plots, over the batches between ``since`` (an earlier
    ``stats()`` of the same loader) and ``stats`` (default: since the start): delivered rows/s
    and MB/s, the share of the loop's time spent waiting, the wait per batch (p50/p95/p99 in
    ms), each worker stage's share of the workers' time, storage MB/s; and the run's busy
    cores (when measured) and batches so far. Plain floats, keys ``prefix + name``.

    >>> from lanceloader.engine.stats import Recorder, count_delivered
    >>> rec = Recorder()
    >>> count_delivered(rec.new_epoch(), 100, 800, 0.02, 0.08, 0.1)
    >>> m = scalars(rec.snapshot())
    >>> m["lanceloader/rows_per_s"], round(m["lanceloader/wait_share"], 3), m["lanceloader/batches"]
    (1000.0, 0.2, 1.0)
    """
    w = window(stats, since)
    wall, cap = w["wall_s"], w["wall_s"] * max(1, stats.workers)
    out = {
        "rows_per_s": w["rows"] / wall if wall > 0 else 0.0,
        "MB_per_s": w["nbytes"] / wall / 1e6 if wall > 0 else 0.0,
        "wait_share": w["wait_s"] / wall if wall > 0 else 0.0,
        **{
            f"wait_{p}_ms": 1000 * w[f"wait_{p}_s"]
            for p in ("p50", "p95", "p99")
            if w[f"wait_{p}_s"] is not None
        },
        **{
            f"{k}_share": w[f"{k}_s"] / cap if cap > 0 else 0.0
            for k in ("read", "decode", "transform", "convert")
        },
        "storage_MB_per_s": w["io_bytes"] / wall / 1e6 if wall > 0 else 0.0,
        "batches": float(stats.batches),
    }
    if stats.cores_busy is not None:
        out["cores_busy"] = stats.cores_busy
    out.update(mix_scalars(getattr(stats, "mix", ()), prefix=""))
    return {prefix + k: float(v) for k, v in out.items()}


def mix_scalars(shares: Any, prefix: str = PREFIX) -> dict[str, float]:
    """A mix's per-source numbers from its ``MixShare``s (``stats().mix`` or
    ``loader.mix_shares()``): ``mix/<source>/weight`` (the target share now, as the interleave
    uses it), ``mix/<source>/share`` (the share it delivered in the current piece of weights),
    ``mix/<source>/rows`` (rows since the loader began) and ``mix/<source>/tokens`` (where
    known); empty for no mix.

    >>> from lanceloader.ordering.mixrun import MixShare
    >>> s = MixShare(3, {"a": 0.75, "b": 0.25}, {"a": 6, "b": 2}, {"a": 6.0, "b": 2.0}, {"a": None, "b": None})
    >>> mix_scalars([s])["lanceloader/mix/a/share"], mix_scalars([s])["lanceloader/mix/b/rows"]
    (0.75, 2.0)
    """
    if not shares:
        return {}
    last, out = shares[-1], {}
    total = sum(last.rows.values())
    for name in last.rows:
        out[f"mix/{name}/weight"] = last.weights[name]
        out[f"mix/{name}/share"] = last.rows[name] / total if total else 0.0
        out[f"mix/{name}/rows"] = float(sum(s.rows[name] for s in shares))
        tokens = [s.tokens[name] for s in shares]
        if all(t is not None for t in tokens):
            out[f"mix/{name}/tokens"] = float(sum(tokens))
    return {prefix + k: float(v) for k, v in out.items()}


@dataclass(frozen=True)
class Totals:
    """The sums a window needs, as :class:`Stats` holds them (which serves as well): read
    straight from a loader's recorder by :func:`totals_of`, without the verdict and the rest
    of ``stats()`` (half the cost of a write)."""

    batches: int
    rows: int
    nbytes: int
    wall_s: float
    wait_s: float
    step_s: float
    read_s: float
    decode_s: float
    transform_s: float
    convert_s: float
    io_bytes: int
    workers: int
    cores_busy: float | None
    wait_histogram: tuple[int, ...]


def totals_of(loader: Any) -> Totals | Stats:
    """A loader's sums so far: from its :class:`Recorder` when it has one (a ``Loader``), else
    its ``stats()``."""
    recorder = getattr(loader, "recorder", None)
    if not isinstance(recorder, Recorder):
        return loader.stats()  # type: ignore[no-any-return]
    c = recorder.total_counters()
    return Totals(
        int(c["batches"]),
        int(c["rows"]),
        int(c["nbytes"]),
        c["wall_s"],
        c["wait_s"],
        c["step_s"],
        c["read_s"],
        c["decode_s"],
        c["transform_s"],
        c["convert_s"],
        int(c["io_bytes"]),
        getattr(loader, "num_workers", 1),
        cores_busy(c),
        _histogram_of(c),
    )


_histogram_of = operator.itemgetter(*WAIT_KEYS)  # the counters' wait histogram, as a tuple


def window(stats: Stats | Totals, since: Stats | Totals | None = None) -> dict[str, Any]:
    """The sums of ``stats`` less those of ``since`` (seconds, rows, bytes), and the wait
    percentiles of the batches in between (from the difference of the wait histograms)."""
    keys = (
        "batches",
        "rows",
        "nbytes",
        "wall_s",
        "wait_s",
        "step_s",
        "read_s",
        "decode_s",
        "transform_s",
        "convert_s",
        "io_bytes",
    )
    w: dict[str, Any] = {k: getattr(stats, k) - (getattr(since, k) if since else 0) for k in keys}
    hist: Any = stats.wait_histogram
    if since is not None and since.wait_histogram:
        hist = list(map(operator.sub, hist, since.wait_histogram))
    w["wait_p50_s"], w["wait_p95_s"], w["wait_p99_s"] = (
        wait_percentiles(hist, (0.5, 0.95, 0.99)) if hist else (None, None, None)
    )
    return w
