"""The loader on an emulated object store, against raw single-threaded Lance on the same store.

The store: the tests' S3 server (moto on 127.0.0.1, ``tests/s3server.py``) behind the tests'
fault proxy (``tests/faultproxy.py``, in a process of its own) adding ``--latency-ms`` to every
request. Both sides read
the same columns (``id``, ``label``, ``x``: 64 float32) of the demo dataset; every figure is a
median of ``--repeats``, and each request count comes from the server's own log.

Cases:

``sequential``
    The Loader (batch 256) over the epoch vs ``ds.to_batches(columns, batch_size=256)``.
``block shuffle``
    The Loader (1024 x 8) over the epoch vs a ``ds.take`` of each 1,024-row block in turn.
``full shuffle``
    The Loader until ``--shuffle-rows`` rows vs ``ds.take`` of the same rows, 256 at a time.

moto is a single Python process: it bounds the absolute numbers (a real store serves many
requests at once). The ratios, loader vs raw on the same server, and the requests per 1,000 rows
are what carry over.

Usage::

    python benchmarks/object_store.py                    # 200k rows, 20 ms, 3 repeats
    python benchmarks/object_store.py --rows 50000 --repeats 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import lance
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import lanceloader as ll  # noqa: E402
from conftest import S3  # noqa: E402
from faultproxy import ProxyProcess  # noqa: E402
from lanceloader.demo import demo_table  # noqa: E402

COLUMNS = ["id", "label", "x"]


timer = [0.0]  # a case may restart the clock once it is set up (the loader's construction)


def timed(fn) -> tuple[float, int]:
    timer[0] = time.perf_counter()
    rows = fn()
    return rows / (time.perf_counter() - timer[0]), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--shuffle-rows", type=int, default=20_000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8, help="loader threads (I/O bound)")
    args = parser.parse_args()

    s3 = S3()
    proxy = ProxyProcess(s3.endpoint)
    try:
        uri = s3.write(demo_table(args.rows), max_rows_per_file=args.rows // 4)
        options = {**s3.storage_options, "endpoint": proxy.endpoint}
        proxy.set(latency_s=args.latency_ms / 1000)
        ds = lance.dataset(uri, storage_options=options)  # raw: opened outside the clock too

        def loader(**kw):
            return ll.Loader(uri, batch_size=256, columns=COLUMNS, storage_options=options,
                             num_workers=args.workers, **kw)

        def epoch(make, limit=None):
            def run() -> int:  # the loader is built (dataset opened) outside the clock
                rows = 0
                it = iter(make())
                timer[0] = time.perf_counter()
                for batch in it:
                    rows += len(batch["id"])
                    if limit and rows >= limit:
                        break
                it.close()
                return rows
            return run

        def raw_sequential() -> int:
            return sum(b.num_rows for b in ds.to_batches(columns=COLUMNS, batch_size=256))

        block = dict(shuffle=True, shuffle_block_size=1024, shuffle_window=8)
        blocks = np.random.default_rng(0).permutation(-(-args.rows // 1024))

        def raw_blocks() -> int:
            rows = 0
            for b in blocks:
                ids = np.arange(b * 1024, min(args.rows, (b + 1) * 1024))
                rows += ds.take(ids, columns=COLUMNS).num_rows
            return rows

        order = np.random.default_rng(1).permutation(args.rows)[:args.shuffle_rows]

        def raw_takes() -> int:
            return sum(ds.take(order[i:i + 256], columns=COLUMNS).num_rows
                       for i in range(0, len(order), 256))

        cases = {
            "sequential": (epoch(loader), raw_sequential),
            "block shuffle 1024x8": (epoch(lambda: loader(**block)), raw_blocks),
            "full shuffle": (epoch(lambda: loader(shuffle=True), args.shuffle_rows), raw_takes),
        }
        results = {}
        for name, (ours, raw) in cases.items():
            figures = {"loader": [], "raw": [], "loader req": [], "raw req": []}
            for _ in range(args.repeats):
                for side, fn in (("loader", ours), ("raw", raw)):
                    s3.requests(reset=True)
                    rate, rows = timed(fn)
                    figures[side].append(rate)
                    figures[f"{side} req"].append(1000 * sum(s3.requests().values()) / rows)
            results[name] = {k: statistics.median(v) for k, v in figures.items()}
    finally:
        proxy.stop()
        s3.stop()

    print(f"{args.rows:,} rows, {args.latency_ms:g} ms per request, loader "
          f"{args.workers} threads, medians of {args.repeats}")
    print(f"{'case':<22}{'loader rows/s':>14}{'raw rows/s':>12}{'ratio':>8}"
          f"{'req/1k rows':>13}{'raw req/1k':>12}")
    for name, r in results.items():
        print(f"{name:<22}{r['loader']:>14,.0f}{r['raw']:>12,.0f}"
              f"{r['loader'] / r['raw']:>7.2f}x{r['loader req']:>13.1f}{r['raw req']:>12.1f}")
    seq, blk = results["sequential"], results["block shuffle 1024x8"]
    print(f"block / sequential (loader): {blk['loader'] / seq['loader']:.2f}x rows/s, "
          f"{blk['loader req'] / max(seq['loader req'], 1e-9):.2f}x requests per 1,000 rows")


if __name__ == "__main__":
    main()
