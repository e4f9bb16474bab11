"""The loader on an emulated object store, against raw single-threaded Lance on the same store,
without and with its cache.

The store: the tests' S3 server (moto on 127.0.0.1, ``tests/s3server.py``) behind the tests'
fault proxy (``tests/faultproxy.py``, in a process of its own) adding ``--latency-ms`` to every
request. Every side reads the same columns (``id``, ``label``, ``x``: 64 float32) of the demo
dataset, opens the dataset afresh for each run (outside the clock: a new ``lance.dataset`` for
raw, a new ``Loader`` for the loader, so both pay the first reads of each file's metadata), and
every figure is a median of ``--repeats``; request counts come from the server's own log.

Without a cache:

``sequential``
    The Loader (batch 256) over the epoch vs ``ds.to_batches(columns, batch_size=256)``.
``block shuffle``
    The Loader (1024 x 8) over the epoch vs a ``ds.take`` of each 1,024-row block in turn.
``full shuffle``
    The Loader until ``--shuffle-rows`` rows vs ``ds.take`` of the same rows, 256 at a time.

With ``cache=`` a fresh directory, per order: the first epoch (filling the cache) against the
same epoch without a cache, and the second epoch against the same order on a local-disk copy of
the dataset (no cache). The second epoch reads pieces its own loader wrote (checked as they were
written); a *new* loader's epoch on the filled directory checks every piece's checksum when it
first opens it: its rows/s next to the second epoch's, and the checksum alone (``check_sealed``
on every piece file, timed apart) as a fraction of that epoch's time, give what checking costs. With ``cache="memory"``: the second epoch of a full shuffle against a
raw ``to_batches`` scan of the local copy. ``--rss`` also measures, in fresh processes, the peak
RSS and the largest size of a cache directory capped below the data, for two dataset sizes.

Every "without a cache" loader passes ``cache=None`` (the default is ``"auto"``). With no cache
argument (the automatic cache, one directory under ``/dev/shm``, emptied before each run): the first and
second epochs of a sequential read and of a full shuffle (whole epochs), against the same order's
rows/s with ``cache=None`` (the table above: a full shuffle's first ``--shuffle-rows`` rows) and
against raw ``to_batches`` on the store.

moto is a single Python process: it bounds the absolute numbers (a real store serves many
requests at once). The ratios, loader vs raw on the same server, and the requests per 1,000 rows
are what carry over.

``--sequential`` runs only issue 26's target: a sequential epoch of the loader with
``cache=None`` and with the default ``cache="auto"`` (epoch 1, the cache emptied before) against raw ``to_batches`` on the same store, the three alternated in each repeat (their
order rotating; the automatic cache is one directory under ``/dev/shm`` for the whole
benchmark, joined once as a training process joins it, and emptied outside the clock before
each run), and prints a Markdown table: median rows/s with the spread (min-max), the ratio
to the raw scan, the requests each epoch made (the server's count) and this process's CPU
seconds per epoch (all threads; under load the CPU and the requests are the steadier evidence).

Usage::

    python benchmarks/object_store.py                    # 200k rows, 20 ms, 3 repeats
    python benchmarks/object_store.py --sequential --repeats 3   # the target alone, ~1 minute
    python benchmarks/object_store.py --sequential --rows 1000000 --files 20   # 20 files
    python benchmarks/object_store.py --rows 50000 --repeats 1 --rss
    python benchmarks/object_store.py --cache-only --repeats 5   # the cache's epochs alone
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lance
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import lanceloader as ll  # noqa: E402
from conftest import S3  # noqa: E402
from faultproxy import ProxyProcess  # noqa: E402
from lanceloader.demo import demo_table, write_demo_dataset  # noqa: E402
from lanceloader.rows.cache import auto as autocache  # noqa: E402
from lanceloader.rows.cache import pieces as cache_module  # noqa: E402

COLUMNS = ["id", "label", "x"]
BLOCK = dict(shuffle=True, shuffle_block_size=1024, shuffle_window=8)
ORDERS = {"sequential": {}, "block shuffle 1024x8": BLOCK, "full shuffle": {"shuffle": True}}


def median_run(s3: S3, fn, repeats: int) -> tuple[float, float]:
    """Median rows/s and requests per 1,000 rows of ``fn`` (returns rows; calls ``start()``
    once set up, which starts the clock)."""
    rates, requests = [], []
    clock = [0.0]

    def start() -> None:
        s3.requests(reset=True)
        clock[0] = time.perf_counter()

    for _ in range(repeats):
        rows = fn(start)
        rates.append(rows / (time.perf_counter() - clock[0]))
        requests.append(1000 * sum(s3.requests().values()) / rows)
    return statistics.median(rates), statistics.median(requests)


def epochs(make, count: int, limit: int | None = None):
    """A run: a new loader (outside the clock); the rows/s of its epoch ``count`` (1-based)."""

    def run(start) -> int:
        loader = make()
        for _ in range(count - 1):
            for _ in loader:
                pass
        rows = 0
        iterator = iter(loader)
        start()
        for batch in iterator:
            rows += len(batch["id"])
            if limit and rows >= limit:
                break
        iterator.close()
        return rows

    return run


def cache_footprint(uri: str, cap: int, queue) -> None:
    """In a fresh process: one sequential and one block-shuffled epoch through a capped cache
    directory; the peak RSS (bytes) and the largest directory size seen after any batch."""
    with tempfile.TemporaryDirectory() as cache:
        largest = 0
        for order in ({}, BLOCK):
            loader = ll.Loader(
                uri, batch_size=256, columns=COLUMNS, cache=cache, cache_size=cap, **order
            )
            for i, _ in enumerate(loader):
                if i % 16 == 0:
                    largest = max(largest, loader.source.cache.used_bytes())
        queue.put((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, largest))


def empty_auto_cache() -> None:
    """Remove what the automatic cache holds (outside the clock), keeping its directory and its
    users' lock: the next epoch fills it as a first one does, in a process that joined it
    already (as a training process has by its second loader)."""
    for entry in Path(os.environ[autocache.AUTO_DIR_VARIABLE]).rglob("*"):
        if entry.is_file() and entry.name != autocache.USERS_LOCK:
            entry.unlink()


def checksum_seconds(directory: str) -> float:
    """Seconds to check every piece file of a filled cache ``directory`` (the check a process
    makes when it first opens a piece), the files in the page cache as in an epoch."""
    total = 0.0
    for path in sorted(Path(directory).glob("*" + cache_module.SUFFIX)):
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            cache_module.check_sealed(fd, size, path.name[: -len(cache_module.SUFFIX)])  # warm
            started = time.perf_counter()
            cache_module.check_sealed(fd, size, path.name[: -len(cache_module.SUFFIX)])
            total += time.perf_counter() - started
        finally:
            os.close(fd)
    return total


def sequential_table(s3: S3, cases: dict, repeats: int) -> None:
    """Each case (``fn(start) -> rows``) once per repeat, in an order rotating per repeat;
    prints the Markdown table of ``--sequential`` (the first case is the yardstick)."""
    names = list(cases)
    rates: dict[str, list[float]] = {n: [] for n in names}
    requests: dict[str, list[int]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    load = os.getloadavg()[0]
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            clock = [0.0, 0.0]

            def start(clock: list[float] = clock) -> None:
                gc.collect()  # the runs before: their loaders freed outside every clock
                s3.requests(reset=True)
                clock[:] = time.perf_counter(), time.process_time()

            rows = cases[name](start)
            rates[name].append(rows / (time.perf_counter() - clock[0]))
            cpu[name].append(time.process_time() - clock[1])
            requests[name].append(sum(s3.requests().values()))
    raw = statistics.median(rates[names[0]])
    print(
        f"\nsequential epoch on the store, medians of {repeats} alternated runs (load average "
        f"{load:.1f} before, {os.getloadavg()[0]:.1f} after)\n"
    )
    print("| side | rows/s | spread | vs raw scan | requests per epoch | CPU s per epoch |")
    print("|---|---|---|---|---|---|")
    for name in names:
        median = statistics.median(rates[name])
        print(
            f"| {name} | {median:,.0f} | {min(rates[name]):,.0f}-{max(rates[name]):,.0f} | "
            f"{median / raw:.2f}x | {statistics.median(requests[name]):.0f} | "
            f"{statistics.median(cpu[name]):.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=4, help="data files (fragments) written")
    parser.add_argument("--shuffle-rows", type=int, default=20_000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8, help="loader threads (I/O bound)")
    parser.add_argument("--rss", action="store_true", help="also measure RSS and the disk cap")
    parser.add_argument(
        "--cache-only", action="store_true", help="only the epochs through cache= a directory"
    )
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="only a sequential epoch (cache=None, cache='auto') vs raw Lance",
    )
    args = parser.parse_args()

    s3 = S3()
    proxy = ProxyProcess(s3.endpoint)
    scratch = tempfile.TemporaryDirectory()
    # The automatic cache in a directory of this run's own, joined once (one sweeper process,
    # as in a training process) and emptied before each run that measures it
    shm = tempfile.TemporaryDirectory(dir="/dev/shm", prefix="llbench-")
    os.environ[autocache.AUTO_DIR_VARIABLE] = shm.name
    local = write_demo_dataset(
        Path(scratch.name) / "local.lance", rows=args.rows, fragments=args.files
    )
    results: dict[str, dict[str, float]] = {}
    cached: dict[str, dict[str, float]] = {}
    try:
        uri = s3.write(demo_table(args.rows), max_rows_per_file=-(-args.rows // args.files))
        options = {**s3.storage_options, "endpoint": proxy.endpoint}
        proxy.set(latency_s=args.latency_ms / 1000)

        def raw_dataset():
            return lance.dataset(uri, storage_options=options)

        def loader(dataset=uri, **kw):
            store = {"storage_options": options} if dataset == uri else {}
            kw.setdefault("cache", None)  # "without a cache" means it (the default is "auto")
            return ll.Loader(
                dataset, batch_size=256, columns=COLUMNS, num_workers=args.workers, **store, **kw
            )

        def raw_sequential(start) -> int:
            ds = raw_dataset()
            start()
            return sum(b.num_rows for b in ds.to_batches(columns=COLUMNS, batch_size=256))

        blocks = np.random.default_rng(0).permutation(-(-args.rows // 1024))

        def raw_blocks(start) -> int:
            ds, rows = raw_dataset(), 0
            start()
            for b in blocks:
                ids = np.arange(b * 1024, min(args.rows, (b + 1) * 1024))
                rows += ds.take(ids, columns=COLUMNS).num_rows
            return rows

        shuffled = np.random.default_rng(1).permutation(args.rows)[: args.shuffle_rows]

        def raw_takes(start) -> int:
            ds = raw_dataset()
            start()
            return sum(
                ds.take(shuffled[i : i + 256], columns=COLUMNS).num_rows
                for i in range(0, len(shuffled), 256)
            )

        raws = {
            "sequential": raw_sequential,
            "block shuffle 1024x8": raw_blocks,
            "full shuffle": raw_takes,
        }
        if args.sequential:

            def auto_epoch(start) -> int:
                empty_auto_cache()  # outside the clock: epoch 1 fills it
                return epochs(lambda: loader(cache="auto"), 1)(start)

            sequential_table(
                s3,
                {
                    "raw `to_batches`": raw_sequential,
                    "loader, `cache=None`": epochs(loader, 1),
                    'loader, `cache="auto"` (epoch 1)': auto_epoch,
                },
                args.repeats,
            )
            return
        for name, order in ({} if args.cache_only else ORDERS).items():
            limit = args.shuffle_rows if name == "full shuffle" else None
            ours, ours_req = median_run(
                s3, epochs(lambda o=order: loader(**o), 1, limit), args.repeats
            )
            raw, raw_req = median_run(s3, raws[name], args.repeats)
            results[name] = {"loader": ours, "raw": raw, "loader req": ours_req, "raw req": raw_req}

        for name, order in ORDERS.items():

            def with_cache(epoch: int, o=order) -> float:
                def run(start) -> int:
                    with tempfile.TemporaryDirectory() as directory:
                        return epochs(lambda: loader(cache=directory, **o), epoch)(start)

                return median_run(s3, run, args.repeats)

            def new_loader(o=order) -> float:
                """An epoch of a new loader on a directory another loader filled."""

                def run(start) -> int:
                    with tempfile.TemporaryDirectory() as directory:
                        epochs(lambda: loader(cache=directory, **o), 1)(lambda: None)
                        return epochs(lambda: loader(cache=directory, **o), 1)(start)

                return median_run(s3, run, args.repeats)[0]

            fill, fill_req = with_cache(1)
            second, second_req = with_cache(2)
            fresh = new_loader()
            on_disk, _ = median_run(s3, epochs(lambda o=order: loader(local, **o), 1), args.repeats)
            check_s = float("nan")
            if hasattr(cache_module, "check_sealed"):
                with tempfile.TemporaryDirectory() as directory:
                    epochs(lambda o=order, d=directory: loader(cache=d, **o), 1)(lambda: None)
                    check_s = statistics.median(
                        checksum_seconds(directory) for _ in range(args.repeats)
                    )
            cached[name] = {
                "fill": fill,
                "fill req": fill_req,
                "second": second,
                "second req": second_req,
                "local": on_disk,
                "fresh": fresh,
                "check s": check_s,
            }

        def default_epoch(epoch: int, order: dict) -> tuple[float, float]:
            """Epoch ``epoch`` of a loader with no cache argument (the automatic cache, in a
            directory under /dev/shm, emptied first)."""

            def run(start) -> int:
                empty_auto_cache()
                return epochs(lambda: loader(cache="auto", **order), epoch)(start)

            return median_run(s3, run, args.repeats)

        automatic: dict[str, tuple[float, float, float, float]] = {}
        for name in ("sequential", "full shuffle"):
            first, first_req = default_epoch(1, ORDERS[name])
            second, second_req = default_epoch(2, ORDERS[name])
            automatic[name] = (first, first_req, second, second_req)

        memory = memory_req = scan = float("nan")
        if not args.cache_only:
            memory, memory_req = median_run(
                s3, epochs(lambda: loader(cache="memory", shuffle=True), 2), args.repeats
            )

        def raw_local(start) -> int:
            ds = lance.dataset(local)
            start()
            return sum(b.num_rows for b in ds.to_batches(columns=COLUMNS, batch_size=256))

        if not args.cache_only:
            scan, _ = median_run(s3, raw_local, args.repeats)
    finally:
        proxy.stop()
        s3.stop()
        del os.environ[autocache.AUTO_DIR_VARIABLE]

    print(
        f"{args.rows:,} rows, {args.latency_ms:g} ms per request, loader "
        f"{args.workers} threads, medians of {args.repeats}"
    )
    print("\nwithout a cache: the loader vs raw Lance, both on the emulated store")
    print(
        f"{'case':<22}{'loader rows/s':>14}{'raw rows/s':>12}{'ratio':>8}"
        f"{'req/1k rows':>13}{'raw req/1k':>12}"
    )
    for name, r in results.items():
        print(
            f"{name:<22}{r['loader']:>14,.0f}{r['raw']:>12,.0f}"
            f"{r['loader'] / r['raw']:>7.2f}x{r['loader req']:>13.2f}{r['raw req']:>12.2f}"
        )
    if results:
        seq, blk = results["sequential"], results["block shuffle 1024x8"]
        print(
            f"block / sequential (loader): {blk['loader'] / seq['loader']:.2f}x rows/s, "
            f"{blk['loader req'] / max(seq['loader req'], 1e-9):.2f}x requests per 1,000 rows"
        )

    print(
        "\nwith cache= a directory: epoch 1 fills it (vs the same epoch without a cache), "
        "epoch 2 reads it (vs the same order on local disk)"
    )
    print(
        f"{'case':<22}{'epoch 1':>11}{'time vs none':>14}{'req/1k':>8}{'epoch 2':>12}"
        f"{'local disk':>12}{'ratio':>8}{'req/1k':>8}"
    )
    for name, c in cached.items():
        none = results[name]["loader"] / c["fill"] if results else float("nan")
        print(
            f"{name:<22}{c['fill']:>11,.0f}{none:>13.2f}x"
            f"{c['fill req']:>8.2f}{c['second']:>12,.0f}{c['local']:>12,.0f}"
            f"{c['second'] / c['local']:>7.2f}x{c['second req']:>8.2f}"
        )
    print(
        "\nchecksums: a new loader's epoch on the filled directory (each piece checked at its "
        "first open) vs the second epoch (pieces this loader wrote); the checks alone as a "
        "share of the epoch's time"
    )
    print(
        f"{'case':<22}{'new loader':>12}{'epoch 2':>12}{'ratio':>8}{'checks s':>10}{'of epoch':>10}"
    )
    for name, c in cached.items():
        epoch_s = args.rows / c["second"]
        print(
            f"{name:<22}{c['fresh']:>12,.0f}{c['second']:>12,.0f}"
            f"{c['fresh'] / c['second']:>7.2f}x{c['check s']:>10.4f}"
            f"{100 * c['check s'] / epoch_s:>9.1f}%"
        )
    seq, blk = cached["sequential"], cached["block shuffle 1024x8"]
    print(
        f"block / sequential, epoch 1 through the cache: {blk['fill'] / seq['fill']:.2f}x "
        f"rows/s, {blk['fill req'] / max(seq['fill req'], 1e-9):.2f}x requests per 1,000 rows"
    )
    if not args.cache_only:
        print(
            f"\ncache='memory', full shuffle epoch 2: {memory:,.0f} rows/s "
            f"({memory_req:.2f} req/1k rows) vs raw to_batches on local disk {scan:,.0f} "
            f"rows/s: {memory / scan:.2f}x"
        )

    print(
        "\nno cache argument (the automatic cache, a directory under /dev/shm): epochs 1 and "
        "2 vs the same order with cache=None (epoch 1) and vs raw to_batches on the store"
    )
    print(
        f"{'case':<22}{'epoch 1':>11}{'vs none':>9}{'req/1k':>8}{'epoch 2':>12}"
        f"{'vs raw scan':>13}{'req/1k':>8}"
    )
    for name, (first, first_req, second, second_req) in automatic.items():
        none = results[name]["loader"] if name in results else float("nan")
        raw = results["sequential"]["raw"] if results else float("nan")
        print(
            f"{name:<22}{first:>11,.0f}{first / none:>8.2f}x{first_req:>8.2f}{second:>12,.0f}"
            f"{second / raw:>12.2f}x{second_req:>8.2f}"
        )

    if args.rss:
        print("\npeak RSS and the cache directory's largest size, cap below the data:")
        context = multiprocessing.get_context("spawn")
        for rows in (args.rows, 4 * args.rows):
            path = write_demo_dataset(Path(scratch.name) / f"rss{rows}.lance", rows=rows)
            cap = 40 << 20
            queue = context.Queue()
            child = context.Process(target=cache_footprint, args=(path, cap, queue))
            child.start()
            rss, largest = queue.get(timeout=600)
            child.join()
            print(
                f"  {rows:>9,} rows: peak RSS {rss / 2**20:,.0f} MiB; cache at most "
                f"{largest / 2**20:,.1f} MiB of a {cap / 2**20:,.0f} MiB cap"
            )
    scratch.cleanup()
    shm.cleanup()


if __name__ == "__main__":
    main()
