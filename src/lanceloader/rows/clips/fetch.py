"""Fetching a read's clips on an object store: the byte ranges of a read's clips, in a few
ranged reads on this process's fetch threads, so they arrive while the first clips decode
(:meth:`lanceloader.rows.clips.source.ClipSource.read_rows`). I/O waits only: decoding stays in the
loader's workers. Bytes in flight: the read's own clips' ranges; every wait is bounded by
:data:`FETCH_WAIT_S`.

Example::

    >>> fetch_chunks(8)
    [[0], [1], [2, 3], [4, 5, 6, 7]]
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from typing import Any

FETCH_CHUNKS = 4  # ranged reads a read's clips are fetched in (1, 1, 2, 4... clips; the rest)
FETCH_WAIT_S = 600.0  # the longest a read waits for its clips' bytes (Lance's own timeouts first)


def fetch_threads() -> concurrent.futures.ThreadPoolExecutor:
    """A read's own pool of threads that wait for its clips' ranged reads and its rows'
    columns (:data:`FETCH_CHUNKS` + 1: every fetch of the read at once). They only wait on
    Lance (its Rust runtime does the I/O); decoding stays in the loader's worker. The read that
    makes the pool shuts it down before it returns (:func:`close_fetch_threads`), so no thread
    outlives its read; starting five threads costs well under a millisecond, a clip's decode
    tens of milliseconds.

    >>> pool = fetch_threads()
    >>> pool.submit(sum, [1, 2]).result()
    3
    >>> close_fetch_threads(pool, done=True)
    """
    return concurrent.futures.ThreadPoolExecutor(
        FETCH_CHUNKS + 1, thread_name_prefix="lanceloader-clip-fetch"
    )


def close_fetch_threads(pool: concurrent.futures.ThreadPoolExecutor, done: bool) -> None:
    """Shut a read's pool down: after a read that got everything (``done``), join its idle
    threads (at once); after a failed read, cancel what has not started and let a fetch in
    flight end by itself (Lance's request timeouts bound it) without waiting for it."""
    pool.shutdown(wait=done, cancel_futures=not done)


def fetch_chunks(clips: int, most: int = FETCH_CHUNKS) -> list[list[int]]:
    """The read's clips (``0 .. clips - 1``) in at most ``most`` consecutive chunks of 1, 1, 2,
    4... clips (the last takes the rest): the first clip's bytes come with the least wait, and
    each later chunk has the decodes before it to arrive in.

    >>> fetch_chunks(8)
    [[0], [1], [2, 3], [4, 5, 6, 7]]
    >>> fetch_chunks(3), fetch_chunks(0)
    ([[0], [1], [2]], [])
    """
    chunks: list[list[int]] = []
    start, size = 0, 1
    while start < clips:
        end = clips if len(chunks) == most - 1 else min(clips, start + size)
        chunks.append(list(range(start, end)))
        start, size = end, size if len(chunks) == 1 else size * 2
    return chunks


def wait_fetched(future: concurrent.futures.Future) -> Any:
    """What a fetch thread's ``future`` gives (or raises), waiting at most :data:`FETCH_WAIT_S`.

    >>> done = concurrent.futures.Future()
    >>> done.set_result(b"bytes")
    >>> wait_fetched(done)
    b'bytes'
    """
    try:
        return future.result(timeout=FETCH_WAIT_S)
    except concurrent.futures.TimeoutError as exc:
        raise TimeoutError(
            f"a read's clips or rows did not arrive in {FETCH_WAIT_S:g} s: the object store is "
            "unreachable or stuck; check the endpoint and the network, or lower the storage "
            "options' request timeouts"
        ) from exc


class Undecodable(Exception):
    """Clip ``clip`` of a read (media ``position``, Lance row ``offset``, first frame or sample
    ``start``) failed to decode; the decoder's error is ``__cause__``."""

    def __init__(self, kind: str, clip: int, position: int, offset: int, start: int) -> None:
        super().__init__(kind, clip, position, offset, start)
        self.kind, self.clip, self.position, self.offset, self.start = (
            kind,
            clip,
            position,
            offset,
            start,
        )


@dataclass
class PlannedClip:
    """One clip of a read: its ``(row offset, offset, length)`` byte ranges, the video's
    ``VideoInfo`` and blob size, and the error that names it if it fails to decode."""

    ranges: list[tuple[int, int, int]]
    info: Any
    size: int
    clip: Undecodable


@dataclass
class VideoFetches:
    """A read's clips and the fetches of their bytes in flight: ``futures[k]`` gives the ranges
    of the clips ``chunks[k]`` that no earlier chunk fetched. Memory: the read's clips' encoded bytes (about two GOPs per
    clip), as before the fetch was split; nothing outlives the read."""

    clips: list[PlannedClip]
    chunks: list[list[int]]
    futures: list[concurrent.futures.Future]

    def wait(self, future: concurrent.futures.Future) -> dict[tuple[int, int, int], bytes]:
        """The ranges ``future`` fetched, waiting at most :data:`FETCH_WAIT_S`."""
        return wait_fetched(future)

    def cancel(self) -> None:
        """Drop the fetches not started (after an error, or when done: a no-op)."""
        for future in self.futures:
            future.cancel()
