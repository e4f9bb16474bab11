"""Pretraining recipes: what mixing and packing cost, and what their checkpoints weigh.

Method
------
Ratios of numbers measured in the same process: every case runs once untimed (Lance, the page
cache and the allocator warmed alike), then ``--repeats`` rounds in which each case runs once,
the order reversed every other round; a ratio is the median of each round's paired ratio
(spread: min-max), so drift of a shared machine cancels. 2 shared cores: single runs move 2x.
Next to rows/s, the mix table gives the CPU time per row (``time.process_time`` of the whole
process over an epoch: the workers' and Lance's threads too) as a ratio ``single / mix``: the
work a row costs, which other jobs on the machine move far less than they move rows/s; and
the page faults an epoch (a count: a mix whose freed reads went back to the kernel faulted
27,600-61,000 times an epoch where one source did 7,000-9,000, before ``reuse_freed_memory`` in the training process).

Cases
-----
``mix``
    ``Loader(Mix({a, b, c}, equal weights))`` over three datasets of ``--rows / 3`` rows each vs
    ``Loader`` over one dataset of ``--rows`` rows with the same columns (an int64 id and 64
    float32) and fragments of the same size (12 in all on each side), numpy output, 2 thread
    workers, batch 256, ``cache=None`` on both sides (the mix's cost, not a cache's choice):
    sample by sample (``mix``) and one source per batch (``run_length=256``), in sequential
    order, in block shuffle (each source block-shuffled, 1,024-row blocks), and in sequential
    order with 2 process workers (rows/s only: the workers' CPU time is not this process's).
    A mix's reads are sized by its sources (``MixedSource.read_parts``: 3 equal sources, 3
    times a single source's read, so each source's Lance call is as large as on its own);
    ``per batch, reads of one source's size`` is the A/B against reads of a single source's
    rows (what the engine did before). Targets (issue 26): block shuffle and one source per
    batch >= 0.94x a single source, sample by sample >= 0.8x or the copy floor: ``copy_floor`` times,
    on one thread, a worker's task of 65,536 rows of the single source against placing as many
    rows of three sources in mixed order (by strides of the interleave's pattern, as a mix does, and by one Arrow take), and
    states the best ratio a sample-by-sample mix can reach, ``read / (read + place)``. The
    *end-to-end* copy floor runs in the sequential rounds themselves: the single source with
    every row of every read copied once more (``single_copied``, :func:`copy_every_row`), so
    its ratio is what one copy per row costs a whole pipeline (2 workers, Lance's threads,
    the caches shared), and the table gives sample by sample against it.
``pack``
    Packing ``--docs`` documents of 1-2,000 tokens (mean ~700) into 2,048-token rows:
    (a) ``pack_tokens`` alone (the per-batch work, one core) in tokens/s, target >= 5M;
    (b) the whole packed loader (reads + packing, one worker) vs reading the same token lists
    with a plain ``Loader`` (one worker), tokens/s;
    (c) the plan: seconds to compute it at construction, and its padding fraction next to
    first-fit decreasing over the same window and to next-fit (rows filled in storage order,
    a new row when the next document does not fit). Target: padding <= first-fit.
    (d) the language-model recipe: a mix of three packed token datasets vs one packed dataset
    with as many documents, tokens/s with 2 workers (no target; what mixing costs there).
``state``
    ``len(json.dumps(state_dict()))`` of a mix loader and of a packed loader, and the time from
    ``load_state_dict`` to the first batch at 10% and at 90% of an epoch. Targets: <= 2 KB;
    resume time independent of the position.

Usage::

    python benchmarks/pretraining.py                    # 2.4M rows, 200k documents, 5 repeats
    python benchmarks/pretraining.py --cases mix        # the mixing table only
    python benchmarks/pretraining.py --rows 60000 --docs 20000 --repeats 1   # smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import lanceloader as ll
from lanceloader.ordering.interleave import Interleave, locate
from lanceloader.ordering.plan import read_tasks
from lanceloader.rows.gather import gather_rows
from lanceloader.rows.packing import pack_plan, pack_tokens
from lanceloader.rows.protocol import Read, as_table

BATCH = 256
SEQ_LEN = 2048


def table(rows: int, start: int) -> pa.Table:
    x = np.random.default_rng(start).standard_normal((rows, 64), dtype=np.float32)
    return pa.table(
        {
            "id": np.arange(start, start + rows),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 64),
        }
    )


def datasets(root: Path, rows: int) -> tuple[str, list[str]]:
    single = root / f"single-{rows}.lance"
    if not single.exists():
        lance.write_dataset(table(rows, 0), single, max_rows_per_file=rows // 12 + 1)
    parts = []
    for k in range(3):
        part = root / f"part{k}-{rows}.lance"
        if not part.exists():
            lance.write_dataset(table(rows // 3, k * rows), part, max_rows_per_file=rows // 12 + 1)
        parts.append(str(part))
    return str(single), parts


def token_dataset(root: Path, docs: int, seed: int = 1) -> tuple[str, np.ndarray]:
    lengths = np.random.default_rng(seed).integers(1, 2000, docs)
    uri = root / f"tokens-{docs}-{seed}.lance"
    if not uri.exists():
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        values = pa.array(
            np.random.default_rng(seed + 1).integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
        )
        lists = pa.LargeListArray.from_arrays(pa.array(offsets), values).cast(pa.list_(pa.int32()))
        lance.write_dataset(pa.table({"input_ids": lists}), uri, max_rows_per_file=50_000)
    return str(uri), lengths


def epoch_cost(loader: ll.Loader) -> tuple[float, float, int]:
    """Rows/s of one epoch, the CPU time of this process per row, in ns (every thread: the
    workers' and Lance's), and its page faults (minor: memory the allocator gave back to the
    kernel and took again, ~1-3 us each; a count other jobs on the machine do not move)."""
    t0, cpu = time.perf_counter(), time.process_time()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    rows = sum(len(b["id"]) for b in loader)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return rows / (time.perf_counter() - t0), (time.process_time() - cpu) / rows * 1e9, faults


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min and max of repeated measurements (what the tables quote)."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": values,
    }


def alternated(cases: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Each case once untimed (warming Lance, the page cache and the allocator alike), then
    ``repeats`` rounds in which every case runs once, the order reversed every other round."""
    for run in cases.values():
        run()
    results: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(repeats):
        for name in names[:: 1 if r % 2 == 0 else -1]:
            results[name].append(cases[name]())
    return results


def ratios(results: dict[str, list[tuple[float, float, int]]], base: str) -> dict[str, Any]:
    """Each case against ``base``: the ratio of each round's two runs (paired in time, so
    the machine's drift cancels), as median and spread, of rows/s (``ratio``) and of CPU time
    per row (``cpu_ratio``: base / case, so above 1 is cheaper), and the runs' figures (page
    faults an epoch too)."""
    out = {}
    for name, runs in results.items():
        rates, cpus = [r[0] for r in runs], [r[1] for r in runs]
        paired = [a[0] / b[0] for a, b in zip(runs, results[base], strict=True)]
        cpu = [b[1] / a[1] for a, b in zip(runs, results[base], strict=True)]
        out[name] = {
            "rows_per_s": spread(rates),
            "ratio": spread(paired),
            "cpu_ns_per_row": spread(cpus),
            "cpu_ratio": spread(cpu),
            "page_faults": spread([r[2] for r in runs]),
        }
    return out


def copy_every_row(loader: ll.Loader) -> ll.Loader:
    """``loader`` (thread workers, one source) with every row of every read copied once into
    new buffers, by the copy a mix places its rows with (:func:`gather_rows`, by strides; here
    the cheapest stride, one). What a single source costs when each row moves once more: the
    floor of a sample-by-sample mix in the same process, on the same cores, with the same
    workers and reads (the one-thread ``copy_floor`` times the copy alone, its tables hot in
    the CPU's caches). A benchmark instrument: it replaces the source's ``read_rows`` on this
    loader's own source object, which its thread workers share."""
    source = loader.source
    read_rows = source.read_rows

    def copied(positions: np.ndarray, epoch: int = 0) -> Read:
        read = read_rows(positions, epoch)
        rows = as_table(read.rows)
        n = rows.num_rows
        again = gather_rows([rows], [None], [np.arange(n)], n, [(1, 1, [(0, 0)])])
        return dataclasses.replace(read, rows=again)

    source.read_rows = copied
    return loader


def mix_case(single: str, parts: list[str], repeats: int) -> dict[str, Any]:
    """Three equal sources mixed vs one source of as many rows, per mode (see the module's
    text). ``cache=None`` on both sides: the mix's cost alone, not a cache's choice."""
    out: dict[str, Any] = {}
    block = {"shuffle": True, "shuffle_block_size": 1024}
    for mode, kw, workers in (
        ("sequential", {}, "thread"),
        ("block", block, "thread"),
        ("sequential_processes", {}, "process"),
    ):

        def single_loader(kw: dict[str, Any] = kw, workers: str = workers) -> ll.Loader:
            return ll.Loader(
                single, batch_size=BATCH, num_workers=2, cache=None, worker_type=workers, **kw
            )

        def run_mix(
            kw: dict[str, Any] = kw,
            run_length: int = 1,
            workers: str = workers,
            rows_per_read: int | None = None,
        ) -> tuple[float, float, int]:
            mix = ll.Mix(
                {f"s{k}": ll.Loader(p, cache=None, **kw) for k, p in enumerate(parts)},
                run_length=run_length,
            )
            return epoch_cost(
                ll.Loader(
                    mix,
                    batch_size=BATCH,
                    num_workers=2,
                    worker_type=workers,
                    rows_per_read=rows_per_read,
                )
            )

        # The A/B of the read sizing: reads of a single source's rows, each source's Lance call
        # a third of them (what the engine did before read_parts).
        unsized = single_loader().batches_per_read * BATCH
        cases = {
            "single": lambda f=single_loader: epoch_cost(f()),
            "mix": run_mix,
            "one_source_per_batch": lambda kw=kw, w=workers: run_mix(kw, BATCH, w),
        }
        if workers == "thread":
            cases["one_source_per_batch_unsized_reads"] = lambda kw=kw, w=workers, n=unsized: (
                run_mix(kw, BATCH, w, n)
            )
            cases["single_copied"] = lambda f=single_loader: epoch_cost(copy_every_row(f()))
        out[mode] = ratios(alternated(cases, repeats), "single")
    out["copy_floor"] = copy_floor(single, parts, repeats)
    return out


def copy_floor(single: str, parts: list[str], repeats: int) -> dict[str, Any]:
    """What putting rows in mixed order costs next to reading them, one thread: a worker's
    whole task for 65,536 rows of the single source read in order (Lance read, conversion,
    batches) against placing the same number of rows, read from three sources, in mixed order
    sample by sample: by strides (what a mix does) and by one Arrow take of the parts joined.
    The floor of a sample-by-sample mix is ``read / (read + place)``."""
    loader = ll.Loader(single, batch_size=BATCH, num_workers=1, cache=None)
    pipeline = loader._pipeline
    task = next(read_tasks(0, loader.plan(), 256, ramp=False))
    work = pipeline.work()
    n = len(task.samples)
    tables = [lance.dataset(p).to_table(limit=n // 3 + (k < n % 3)) for k, p in enumerate(parts)]
    # placed as a mix places a read of consecutive samples: by strides of the period's pattern
    runs = locate(
        Interleave((1, 1, 1)), n, [n // 3 + (k < n % 3) for k in range(3)], [0] * 3, np.arange(n)
    )
    places = runs.places(3)
    strides = [runs.slots.strides(k) for k in range(3)]
    joined = np.empty(n, np.int64)
    for k, place in enumerate(places):
        joined[place] = sum(len(t) for t in tables[:k]) + np.arange(len(place))

    def timed(f: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:
            t0 = time.perf_counter()
            for _ in range(5):
                f()
            return n * 5 / (time.perf_counter() - t0)

        return run

    cases = {
        "read": timed(lambda: work(task)),
        "scatter": timed(lambda: gather_rows(tables, [None] * 3, places, n, strides)),
        "arrow_take": timed(
            lambda: pa.concat_tables(tables).combine_chunks().take(pa.array(joined))
        ),
    }
    results = alternated(cases, repeats)
    read = statistics.median(results["read"])
    out = {name: {"rows_per_s": spread(runs)} for name, runs in results.items()}
    for name in ("scatter", "arrow_take"):
        place = statistics.median(results[name])
        out[name]["floor"] = (1 / read) / (1 / read + 1 / place)
    return out


def mix_table(mix: dict[str, Any]) -> str:
    """The mix results as the Markdown table docs/pretraining.md quotes."""
    lines = [
        "| mode | single source (rows/s) | mix / single: rows/s | CPU per row | "
        "one source per batch / single: rows/s | CPU per row | per batch, reads of one "
        "source's size: rows/s | CPU per row |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode in ("sequential", "block", "sequential_processes"):
        m = mix[mode]

        def ratio(case: str, kind: str = "ratio", m: dict[str, Any] = m, mode: str = mode) -> str:
            if case not in m or (mode == "sequential_processes" and kind == "cpu_ratio"):
                return "-"  # process workers' CPU time is not this process's
            r = m[case][kind]
            return f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"

        cells = [
            ratio(case, kind)
            for case in ("mix", "one_source_per_batch", "one_source_per_batch_unsized_reads")
            for kind in ("ratio", "cpu_ratio")
        ]
        single_rate = m["single"]["rows_per_s"]["median"] / 1e6
        lines.append(
            f"| {mode.replace('_', ', ')} | {single_rate:.2f}M | " + " | ".join(cells) + " |"
        )
    lines.append("")
    lines.append(
        "Page faults an epoch (medians; single / mix / one source per batch): "
        + "; ".join(
            f"{mode.replace('_', ', ')} "
            + " / ".join(
                f"{mix[mode][case]['page_faults']['median']:,.0f}"
                for case in ("single", "mix", "one_source_per_batch")
            )
            for mode in ("sequential", "block")
        )
        + " (process workers' faults are theirs)."
    )
    floor = mix["copy_floor"]
    lines.append("")
    lines.append(
        f"Copy floor of a sample-by-sample mix (one thread, 65,536 rows): a read "
        f"{floor['read']['rows_per_s']['median'] / 1e6:.1f}M rows/s, placing rows "
        f"{floor['scatter']['rows_per_s']['median'] / 1e6:.1f}M rows/s by strides "
        f"(floor {floor['scatter']['floor']:.2f}x), "
        f"{floor['arrow_take']['rows_per_s']['median'] / 1e6:.1f}M rows/s by one "
        f"Arrow take of the parts joined (floor {floor['arrow_take']['floor']:.2f}x)."
    )
    seq = mix["sequential"]
    if "single_copied" in seq:
        copied, mixed = seq["single_copied"], seq["mix"]
        against = spread(
            [
                a / b
                for a, b in zip(
                    mixed["rows_per_s"]["runs"], copied["rows_per_s"]["runs"], strict=True
                )
            ]
        )
        lines.append("")
        lines.append(
            "End-to-end copy floor (sequential, 2 thread workers, same rounds): one source "
            "with every row copied once "
            f"{copied['ratio']['median']:.2f}x ({copied['ratio']['min']:.2f}-"
            f"{copied['ratio']['max']:.2f}) of itself, CPU per row "
            f"{copied['cpu_ratio']['median']:.2f}x; sample by sample against it: "
            f"{against['median']:.2f}x ({against['min']:.2f}-{against['max']:.2f})."
        )
    return "\n".join(lines)


def packed_mix_case(root: Path, uri: str, docs: int, repeats: int) -> dict[str, Any]:
    """A mix of three packed token datasets (docs / 3 documents each) vs one packed dataset of
    ``docs`` documents: the language-model recipe, tokens/s through the loader (2 workers)."""
    parts = [token_dataset(root, docs // 3, seed=10 + k)[0] for k in range(3)]

    def packed(path: str) -> ll.Loader:
        return ll.Loader(
            path,
            columns=["input_ids"],
            pack=ll.pack("input_ids", SEQ_LEN),
            shuffle=True,
            shuffle_block_size=64,
        )

    def rate(loader: ll.Loader) -> float:
        t0 = time.perf_counter()
        tokens = sum(int((b["segment_ids"] > 0).sum()) for b in loader)
        return tokens / (time.perf_counter() - t0)

    def run_one() -> float:
        return rate(
            ll.Loader(
                uri,
                columns=["input_ids"],
                batch_size=16,
                num_workers=2,
                pack=ll.pack("input_ids", SEQ_LEN),
                shuffle=True,
                shuffle_block_size=64,
            )
        )

    def run_mix() -> float:
        mix = ll.Mix({f"s{k}": packed(p) for k, p in enumerate(parts)})
        return rate(ll.Loader(mix, batch_size=16, num_workers=2))

    runs = alternated({"one": run_one, "mix": run_mix}, repeats)
    one, mixed = runs["one"], runs["mix"]
    return {
        "one_packed_tokens_per_s": statistics.median(one),
        "mix_of_packed_tokens_per_s": statistics.median(mixed),
        "ratio": statistics.median([m / o for m, o in zip(mixed, one, strict=True)]),
        "runs": {"one": one, "mix": mixed},
    }


def next_fit_rows(lengths: np.ndarray, seq_len: int) -> int:
    rows, room = 0, 0
    for n in lengths.tolist():
        while n > seq_len:  # whole pieces of a long document
            rows, n = rows + 1, n - seq_len
        if n > room:
            rows, room = rows + 1, seq_len
        room -= n
    return rows


def pack_case(uri: str, lengths: np.ndarray, repeats: int) -> dict[str, Any]:
    plan_s, fits = [], {}
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = pack_plan(lengths, SEQ_LEN)
        plan_s.append(time.perf_counter() - t0)
    fits["best_fit"] = plan.padding_fraction
    fits["first_fit"] = pack_plan(lengths, SEQ_LEN, algorithm="first_fit").padding_fraction
    rows = next_fit_rows(lengths, SEQ_LEN)
    fits["next_fit"] = 1 - lengths.sum() / (rows * SEQ_LEN)
    # (a) pack_tokens alone, on 256-row batches of the plan.
    values = np.random.default_rng(3).integers(0, 50_000, int(lengths.sum()), dtype=np.int32)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    alone = []
    for _ in range(repeats):
        t0, tokens = time.perf_counter(), 0
        for lo in range(0, min(plan.num_rows, 20 * BATCH), BATCH):
            pieces, counts = plan.pieces(np.arange(lo, min(lo + BATCH, plan.num_rows)))
            pack_tokens(
                values,
                starts[plan.doc[pieces]] + plan.offset[pieces],
                plan.length[pieces],
                counts,
                SEQ_LEN,
                0,
                np.int32,
            )
            tokens += int(plan.length[pieces].sum())
        alone.append(tokens / (time.perf_counter() - t0))
    # (b) the packed loader vs reading the same lists, one worker each.
    packed, plain = [], []
    for r in range(repeats):

        def run_packed() -> float:
            loader = ll.Loader(
                uri,
                columns=["input_ids"],
                batch_size=64,
                num_workers=1,
                pack=ll.pack("input_ids", SEQ_LEN),
                shuffle=True,
                shuffle_block_size=64,
            )
            t0 = time.perf_counter()
            tokens = sum(int((b["segment_ids"] > 0).sum()) for b in loader)
            return tokens / (time.perf_counter() - t0)

        def run_plain() -> float:
            loader = ll.Loader(
                uri,
                columns=["input_ids"],
                batch_size=64,
                num_workers=1,
                output="arrow",
                shuffle=True,
                shuffle_block_size=64,
            )
            t0 = time.perf_counter()
            tokens = sum(
                pc.sum(pc.list_value_length(b.column("input_ids"))).as_py() for b in loader
            )
            return tokens / (time.perf_counter() - t0)

        for f, sink in ((run_packed, packed), (run_plain, plain))[:: 1 if r % 2 == 0 else -1]:
            sink.append(f())
    return {
        "docs": len(lengths),
        "seq_len": SEQ_LEN,
        "plan_s": statistics.median(plan_s),
        "plan_s_per_million_docs": statistics.median(plan_s) * 1e6 / len(lengths),
        "padding": fits,
        "pack_tokens_per_s": statistics.median(alone),
        "loader_tokens_per_s": statistics.median(packed),
        "plain_read_tokens_per_s": statistics.median(plain),
        "loader_vs_plain": statistics.median(packed) / statistics.median(plain),
    }


def state_case(parts: list[str], uri: str, repeats: int) -> dict[str, Any]:
    def mix_loader() -> ll.Loader:
        mix = ll.Mix(
            {f"s{k}": ll.Loader(p, columns=["id"], shuffle=True) for k, p in enumerate(parts)},
            weights={"s0": 5, "s1": 3, "s2": 2},
        )
        return ll.Loader(mix, batch_size=BATCH, num_workers=2)

    def packed_loader() -> ll.Loader:
        return ll.Loader(
            uri,
            columns=["input_ids"],
            batch_size=8,
            num_workers=2,
            shuffle=True,
            pack=ll.pack("input_ids", SEQ_LEN),
        )

    out: dict[str, Any] = {}
    for name, make in (("mix", mix_loader), ("packed", packed_loader)):
        loader = make()
        state = loader.state_dict()
        out[name] = {"state_bytes": len(json.dumps(state))}
        built = make()
        for where in (0.1, 0.9):
            times = []
            for _ in range(repeats):
                at = dict(state, sample=int(where * built.plan().num_samples) // BATCH * BATCH)
                t0 = time.perf_counter()
                built.load_state_dict(at)
                it = iter(built)
                next(it)
                times.append(time.perf_counter() - t0)
                it.close()
            out[name][f"resume_to_first_batch_s_at_{int(where * 100)}pct"] = statistics.median(
                times
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_400_000)
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--cases",
        default="mix,pack,state",
        help="comma-separated cases to run (default: all of mix,pack,state)",
    )
    parser.add_argument("--data-dir", default=str(Path(__file__).parent / "data"))
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "pretraining.json")
    )
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    if not cases <= {"mix", "pack", "state"}:
        parser.error(f"--cases takes mix, pack and state, got {args.cases!r}")
    root = Path(args.data_dir)
    root.mkdir(parents=True, exist_ok=True)
    single, parts = datasets(root, args.rows)
    uri, lengths = token_dataset(root, args.docs)
    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "lance": lance.__version__,
            "load_before": os.getloadavg(),
        },
        "args": vars(args),
    }
    if "mix" in cases:
        result["mix"] = mix_case(single, parts, args.repeats)
        result["mix"]["packed_tokens"] = packed_mix_case(root, uri, args.docs, args.repeats)
    if "pack" in cases:
        result["pack"] = pack_case(uri, lengths, args.repeats)
    if "state" in cases:
        result["state"] = state_case(parts, uri, args.repeats)
    result["machine"]["load_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "args"}, indent=2))
    if "mix" in result:
        packed = result["mix"]["packed_tokens"]
        print(
            f"\n{mix_table(result['mix'])}\nMix of 3 packed token datasets vs one: "
            f"{packed['ratio']:.2f}x ({packed['mix_of_packed_tokens_per_s'] / 1e6:.1f}M vs "
            f"{packed['one_packed_tokens_per_s'] / 1e6:.1f}M tokens/s)"
        )
    print(
        f"load average before / after: {result['machine']['load_before'][0]:.1f} / "
        f"{result['machine']['load_after'][0]:.1f} on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
