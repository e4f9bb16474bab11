"""Cache files damaged by another process while a Loader reads them: truncated (to 0 or half)
or written in place (16 random bytes), over and over, mid-epoch, in a directory on tmpfs (given,
and the automatic cache's) and on a disk, with thread and process workers. The training process
never dies of it (a mapped piece truncated under a reader was SIGBUS) and every row it delivers
is the dataset's (bytes written into a mapped piece reached the batches, or raised a
UnicodeDecodeError blaming the dataset); the damage is counted in ``stats().cache_damaged``.

Each case runs a real reader process for ``LANCELOADER_SABOTAGE_TRIALS`` epochs (20 by
default; a trial is an epoch under sabotage) while a saboteur thread here damages the files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from lanceloader.demo import write_demo_dataset
from lanceloader.rows.cache.files import in_memory_filesystem

ROWS = 6000
TRIALS = int(os.environ.get("LANCELOADER_SABOTAGE_TRIALS", "20"))
HERE = Path(__file__).resolve().parents[1]  # tests/

READER = r"""
import json, os, sys
import numpy as np
import lance
import lanceloader as ll
from lanceloader.rows.cache import pieces
pieces.PIECE_BYTES = 1  # pieces of 1,024 rows: six files to damage
uri, cache, worker_type, trials = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
table = lance.dataset(uri).to_table(columns=["id", "label", "x", "text"])
want_label = table["label"].to_numpy()
want_x = np.stack(table["x"].to_numpy(zero_copy_only=False))
want_text = np.array(table["text"].to_pylist(), dtype=object)
kwargs = {} if cache == "auto" else {"cache": cache, "cache_size": 1 << 30}
loader = ll.Loader(uri, batch_size=250, columns=["id", "label", "x", "text"], shuffle=True,
                   output="numpy", num_workers=2, worker_type=worker_type, **kwargs)
epochs = wrong = 0
error = None
try:
    for _ in range(trials):
        seen = []
        for batch in loader:
            ids = np.asarray(batch["id"])
            seen.append(ids)
            wrong += int(np.sum(np.asarray(batch["label"]) != want_label[ids]))
            wrong += int(np.sum(np.any(np.asarray(batch["x"]) != want_x[ids], axis=1)))
            wrong += int(np.sum(np.asarray(batch["text"], dtype=object) != want_text[ids]))
        if not np.array_equal(np.sort(np.concatenate(seen)), np.arange(len(table))):
            wrong += 1  # a row missing or delivered twice
        epochs += 1
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
stats = loader.stats()
print(json.dumps({"epochs": epochs, "wrong": wrong, "error": error,
                  "damaged": stats.cache_damaged, "cache": stats.cache}))
"""


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(
        write_demo_dataset(tmp_path_factory.mktemp("sabotage") / "d.lance", rows=ROWS, fragments=3)
    )


@pytest.fixture
def shm(tmp_path: Path):
    """A fresh directory under /dev/shm (tmpfs), removed afterwards."""
    import shutil
    import tempfile

    if not in_memory_filesystem("/dev/shm"):
        pytest.skip("no tmpfs at /dev/shm on this machine")
    path = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="lanceloader-sabotage-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def sabotage(root: Path, stop: threading.Event, done: list[int], seed: int) -> None:
    """Until ``stop``: damage a random piece file under ``root`` every millisecond or so,
    truncating it (to 0 or half its size) or writing 16 random bytes into it, by turns."""
    rng = np.random.default_rng(seed)
    while not stop.wait(0.001):
        files = sorted(root.rglob("*.arrow"))
        if not files:
            continue
        path = files[int(rng.integers(len(files)))]
        try:
            size = path.stat().st_size
            if rng.random() < 0.5:
                os.truncate(path, int(rng.choice([0, size // 2])))
            else:
                with open(path, "r+b") as file:
                    file.seek(int(rng.integers(max(1, size - 16))))
                    file.write(rng.bytes(16))
            done[0] += 1
        except FileNotFoundError:  # dropped by the reader meanwhile
            pass


def test_cache_files_damaged_mid_epoch_never_kill_the_reader_nor_change_its_rows(
    uri, tmp_path, shm
):
    """Four readers at once (the automatic cache in /dev/shm, a directory on a disk; thread and
    process workers), each with a saboteur of its own directory: every reader ends its
    ``TRIALS`` epochs with every row right, and the damage was seen (``cache_damaged``)."""
    cases = [
        (directory, workers)
        for directory in ("automatic", "disk")
        for workers in ("thread", "process")
    ]
    if in_memory_filesystem(tmp_path):
        cases = [case for case in cases if case[0] != "disk"]  # no disk here
    stop, readers, saboteurs, done = threading.Event(), {}, [], {}
    try:
        for seed, (directory, workers) in enumerate(cases):
            parent = shm / f"{directory}-{workers}"
            root = parent if directory == "automatic" else tmp_path / f"{workers}-cache"
            parent.mkdir()
            env = {**os.environ, "LANCELOADER_AUTO_CACHE_DIR": str(parent)}
            cache = "auto" if directory == "automatic" else str(root)
            readers[(directory, workers)] = subprocess.Popen(
                [sys.executable, "-c", READER, uri, cache, workers, str(TRIALS)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=str(HERE.parent),
                env=env,
            )
            done[(directory, workers)] = [0]
            saboteurs.append(
                threading.Thread(
                    target=sabotage, args=(root, stop, done[(directory, workers)], seed)
                )
            )
            saboteurs[-1].start()
        outcomes = {case: reader.communicate(timeout=600) for case, reader in readers.items()}
    finally:
        stop.set()
        for saboteur in saboteurs:
            saboteur.join()
        for reader in readers.values():
            if reader.poll() is None:
                reader.kill()
                reader.wait()
    for case, (out, err) in outcomes.items():
        code = readers[case].returncode
        assert code == 0, (
            f"{case}: the reader died (exit {code}) after {done[case][0]} "
            f"damaged files:\n{err[-3000:]}"
        )
        result = json.loads(out.strip().splitlines()[-1])
        assert result["error"] is None, f"{case}: {result['error']}"
        assert result["epochs"] == TRIALS and result["wrong"] == 0, (case, result)
        if case[0] == "automatic":
            assert result["cache"].startswith("auto: " + str(shm)), (case, result)
        assert done[case][0] > 0 and result["damaged"] > 0, (case, result)  # the damage bit


def test_a_readers_touch_never_hides_a_write_made_since_it_looked(tmp_path):
    """Readers mark a cache file recently used by setting its access time. They wrote back the
    mtime they had seen, so a write made in between vanished from every other reader's version
    check (and from the record of a checked file, which then passed unchecked)."""
    from lanceloader.rows.cache.files import touch_access_time

    path = tmp_path / "piece.arrow"
    path.write_bytes(b"checked")
    seen = path.stat()
    time.sleep(0.02)  # the write's mtime differs from the one seen, even at a coarse clock
    with open(path, "r+b") as file:  # another process writes in place after the look
        file.write(b"damaged")
    written = path.stat().st_mtime_ns
    assert written != seen.st_mtime_ns
    touch_access_time(str(path), seen.st_mtime_ns)
    assert path.stat().st_mtime_ns == written
    assert path.stat().st_atime_ns >= seen.st_atime_ns
