"""Pretraining recipes: what mixing and packing cost, and what their checkpoints weigh.

Method
------
Ratios of two numbers measured in the same run; every case runs ``--repeats`` times with the two
sides alternating, and medians are quoted (2 shared cores: single runs move by 2x).

Cases
-----
``mix``
    ``Loader(Mix({a, b, c}, equal weights))`` over three datasets of ``--rows / 3`` rows each vs
    ``Loader`` over one dataset of ``--rows`` rows with the same columns (an int64 id and 64
    float32) and fragments of the same size (12 in all on each side), both in sequential order and in block shuffle (each source block-shuffled),
    numpy output, 2 thread workers, batch 256. Target: mix >= 0.9x single source. Also the
    mix with ``run_length=256`` (one source per batch, its rows not copied into mixed order),
    and both in sequential order with 2 process workers (whose batches are copied into shared
    memory, single source or not).
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
    python benchmarks/pretraining.py --rows 60000 --docs 20000 --repeats 1   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import lanceloader as ll
from lanceloader.rows.packed import pack_plan, pack_tokens

BATCH = 256
SEQ_LEN = 2048


def table(rows: int, start: int) -> pa.Table:
    x = np.random.default_rng(start).standard_normal((rows, 64), dtype=np.float32)
    return pa.table({"id": np.arange(start, start + rows),
                     "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 64)})


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
        values = pa.array(np.random.default_rng(seed + 1).integers(0, 50_000, int(offsets[-1]),
                                                            dtype=np.int32))
        lists = pa.LargeListArray.from_arrays(pa.array(offsets), values).cast(
            pa.list_(pa.int32()))
        lance.write_dataset(pa.table({"input_ids": lists}), uri, max_rows_per_file=50_000)
    return str(uri), lengths


def epoch_rate(loader: ll.Loader) -> float:
    t0 = time.perf_counter()
    rows = sum(len(b["id"]) for b in loader)
    return rows / (time.perf_counter() - t0)


def mix_case(single: str, parts: list[str], repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    block = {"shuffle": True, "shuffle_block_size": 1024}
    for mode, kw, workers in (("sequential", {}, "thread"), ("block", block, "thread"),
                              ("sequential_processes", {}, "process")):
        one, mixed, per_batch = [], [], []
        for r in range(repeats):
            def run_single(kw: dict[str, Any] = kw, workers: str = workers) -> float:
                return epoch_rate(ll.Loader(single, batch_size=BATCH, num_workers=2,
                                            worker_type=workers, **kw))

            def run_mix(kw: dict[str, Any] = kw, run_length: int = 1,
                        workers: str = workers) -> float:
                mix = ll.Mix({f"s{k}": ll.Loader(p, **kw) for k, p in enumerate(parts)},
                             run_length=run_length)
                return epoch_rate(ll.Loader(mix, batch_size=BATCH, num_workers=2,
                                            worker_type=workers))

            cases = [(run_single, one), (run_mix, mixed),
                     (lambda kw=kw, workers=workers: run_mix(kw, BATCH, workers), per_batch)]
            for f, sink in cases[:: 1 if r % 2 == 0 else -1]:
                sink.append(f())
        out[mode] = {"single_rows_per_s": statistics.median(one),
                     "mix_rows_per_s": statistics.median(mixed),
                     "ratio": statistics.median(mixed) / statistics.median(one),
                     "mix_one_source_per_batch_rows_per_s": statistics.median(per_batch),
                     "ratio_one_source_per_batch":
                         statistics.median(per_batch) / statistics.median(one),
                     "runs": {"single": one, "mix": mixed, "one_source_per_batch": per_batch}}
    return out


def packed_mix_case(root: Path, uri: str, docs: int, repeats: int) -> dict[str, Any]:
    """A mix of three packed token datasets (docs / 3 documents each) vs one packed dataset of
    ``docs`` documents: the language-model recipe, tokens/s through the loader (2 workers)."""
    parts = [token_dataset(root, docs // 3, seed=10 + k)[0] for k in range(3)]

    def packed(path: str) -> ll.Loader:
        return ll.Loader(path, columns=["input_ids"], pack=ll.pack("input_ids", SEQ_LEN),
                         shuffle=True, shuffle_block_size=64)

    def rate(loader: ll.Loader) -> float:
        t0 = time.perf_counter()
        tokens = sum(int((b["segment_ids"] > 0).sum()) for b in loader)
        return tokens / (time.perf_counter() - t0)

    one, mixed = [], []
    for r in range(repeats):
        def run_one() -> float:
            return rate(ll.Loader(uri, columns=["input_ids"], batch_size=16, num_workers=2,
                                  pack=ll.pack("input_ids", SEQ_LEN), shuffle=True,
                                  shuffle_block_size=64))

        def run_mix() -> float:
            mix = ll.Mix({f"s{k}": packed(p) for k, p in enumerate(parts)})
            return rate(ll.Loader(mix, batch_size=16, num_workers=2))

        for f, sink in ((run_one, one), (run_mix, mixed))[:: 1 if r % 2 == 0 else -1]:
            sink.append(f())
    return {"one_packed_tokens_per_s": statistics.median(one),
            "mix_of_packed_tokens_per_s": statistics.median(mixed),
            "ratio": statistics.median(mixed) / statistics.median(one),
            "runs": {"one": one, "mix": mixed}}


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
            pack_tokens(values, starts[plan.doc[pieces]] + plan.offset[pieces],
                                    plan.length[pieces], counts, SEQ_LEN, 0, np.int32)
            tokens += int(plan.length[pieces].sum())
        alone.append(tokens / (time.perf_counter() - t0))
    # (b) the packed loader vs reading the same lists, one worker each.
    packed, plain = [], []
    for r in range(repeats):
        def run_packed() -> float:
            loader = ll.Loader(uri, columns=["input_ids"], batch_size=64, num_workers=1,
                               pack=ll.pack("input_ids", SEQ_LEN), shuffle=True,
                               shuffle_block_size=64)
            t0 = time.perf_counter()
            tokens = sum(int((b["segment_ids"] > 0).sum()) for b in loader)
            return tokens / (time.perf_counter() - t0)

        def run_plain() -> float:
            loader = ll.Loader(uri, columns=["input_ids"], batch_size=64, num_workers=1,
                               output="arrow", shuffle=True, shuffle_block_size=64)
            t0 = time.perf_counter()
            tokens = sum(pc.sum(pc.list_value_length(b.column("input_ids"))).as_py()
                         for b in loader)
            return tokens / (time.perf_counter() - t0)

        for f, sink in ((run_packed, packed), (run_plain, plain))[:: 1 if r % 2 == 0 else -1]:
            sink.append(f())
    return {"docs": len(lengths), "seq_len": SEQ_LEN, "plan_s": statistics.median(plan_s),
            "plan_s_per_million_docs": statistics.median(plan_s) * 1e6 / len(lengths),
            "padding": fits, "pack_tokens_per_s": statistics.median(alone),
            "loader_tokens_per_s": statistics.median(packed),
            "plain_read_tokens_per_s": statistics.median(plain),
            "loader_vs_plain": statistics.median(packed) / statistics.median(plain)}


def state_case(parts: list[str], uri: str, repeats: int) -> dict[str, Any]:
    def mix_loader() -> ll.Loader:
        mix = ll.Mix({f"s{k}": ll.Loader(p, columns=["id"], shuffle=True)
                      for k, p in enumerate(parts)}, weights={"s0": 5, "s1": 3, "s2": 2})
        return ll.Loader(mix, batch_size=BATCH, num_workers=2)

    def packed_loader() -> ll.Loader:
        return ll.Loader(uri, columns=["input_ids"], batch_size=8, num_workers=2, shuffle=True,
                         pack=ll.pack("input_ids", SEQ_LEN))

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
            out[name][f"resume_to_first_batch_s_at_{int(where * 100)}pct"] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_400_000)
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-dir", default=str(Path(__file__).parent / "data"))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                             "pretraining.json"))
    args = parser.parse_args()
    root = Path(args.data_dir)
    root.mkdir(parents=True, exist_ok=True)
    single, parts = datasets(root, args.rows)
    uri, lengths = token_dataset(root, args.docs)
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "lance": lance.__version__, "load_before": os.getloadavg()},
              "args": vars(args)}
    result["mix"] = mix_case(single, parts, args.repeats)
    result["pack"] = pack_case(uri, lengths, args.repeats)
    result["mix"]["packed_tokens"] = packed_mix_case(root, uri, args.docs, args.repeats)
    result["state"] = state_case(parts, uri, args.repeats)
    result["machine"]["load_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "args"}, indent=2))


if __name__ == "__main__":
    main()
