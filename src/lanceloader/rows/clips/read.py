"""A read of clips: one :class:`ClipRead` per read of a
:class:`~lanceloader.rows.clips.source.ClipSource` (in the worker that runs the read task),
holding the read's opened dataset and what the read did past Lance's own counters (byte ranges
read with ``pread``, :class:`~lanceloader.rows.protocol.StorageIO`) and the seconds it spent
decoding, which its :class:`~lanceloader.rows.protocol.Read` reports (``stats()`` books them as
decode). The fetch threads of an object store add to the same counts while the clips decode.
See the ClipSource module's text for what a read does."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import numpy as np
import pyarrow as pa

from lanceloader.batch.transforms import tensor_array
from lanceloader.rows.clips.fetch import (
    PlannedClip,
    Undecodable,
    VideoFetches,
    close_fetch_threads,
    fetch_chunks,
    fetch_threads,
    wait_fetched,
)
from lanceloader.rows.clips.index import import_audio_ranges, import_video
from lanceloader.rows.clips.windows import AudioClips, VideoClips
from lanceloader.rows.dataset import NOT_READ_FAILURES, ReadError
from lanceloader.rows.protocol import Read, StorageIO, as_table

MAX_EXTRA_READS = 4  # ranged reads a clip may add when the decoder asks for more bytes


class ClipRead:
    """One read of ``source``'s clips, on the pinned dataset ``ds`` opened in this process."""

    def __init__(self, source: Any, ds: Any) -> None:
        self.source, self.ds = source, ds
        self.spec, self.cache = source.spec, source.cache
        self.io = StorageIO()

    def read(self, positions: np.ndarray, epoch: int) -> Read:
        """The clips at ``positions`` (at least one) for ``epoch``: the clips' bytes fetched
        (an object store: on the read's own fetch threads, shut down before it returns) while
        the rows' other columns are read, each clip decoded as its bytes are there."""
        source = self.source
        media = source.windows.media(positions)
        starts = source.windows.starts(positions, source.seed, epoch)
        offsets = source.inner.row_offsets(media)
        unique, where = np.unique(media, return_inverse=True)
        video = isinstance(self.spec, VideoClips)
        pool = fetch_threads() if source.fetch_ahead and video else None
        fetches = rows = None
        done = False
        try:
            if video:  # the clips' bytes are on their way while the rows' columns are read
                fetches = self._fetch_video(media, offsets, starts, pool)
            rows = self._rows_of(unique, epoch, pool)
            clips, decode_s = (
                self._decode_fetched(fetches)
                if fetches is not None
                else self._read_audio(media, offsets, starts)
            )
            inner = wait_fetched(rows) if rows is not None else None
            io = self.ds.io_stats_incremental()  # Lance's I/O since the last read took its count
            done = True
        except Undecodable as bad:  # the row's columns name it (its path)
            raise source.clip_error(bad, _named(rows, where)) from bad.__cause__
        except (ReadError, *NOT_READ_FAILURES):
            raise
        except BaseException as exc:
            raise source.inner.read_error(exc, media) from exc
        finally:
            if fetches is not None:
                fetches.cancel()
            if rows is not None:
                rows.cancel()
            if pool is not None:
                close_fetch_threads(pool, done)
        return self._out(clips, starts, inner, where, io, decode_s)

    def _rows_of(self, unique: np.ndarray, epoch: int, pool: Any) -> Any:
        """The media rows' other columns, read on a fetch thread while the clips decode (an
        object store), else here; ``None`` when the clips carry no other column."""
        source = self.source
        if not source.row_columns:
            return None
        if pool is not None:
            return pool.submit(source.inner.read_rows, unique, epoch)
        rows: concurrent.futures.Future = concurrent.futures.Future()
        rows.set_result(source.inner.read_rows(unique, epoch))
        return rows

    def _out(
        self,
        clips: np.ndarray,
        starts: np.ndarray,
        inner: Read | None,
        where: np.ndarray,
        io: Any,
        decode_s: float,
    ) -> Read:
        """The read's rows (the clips, their starts, the rows' columns) and everything it did:
        the inner read's, Lance's since the last read, the ranges read past Lance."""
        source = self.source
        columns: dict[str, Any] = {}
        if inner is not None:
            table = as_table(inner.rows).select(source.row_columns).take(pa.array(where))
            columns = {c: table.column(c) for c in source.row_columns}
        out = pa.table(
            {
                self.spec.column: tensor_array(clips),
                "clip_start": pa.array(starts, pa.int64()),
                **columns,
            }
        )
        return Read(
            out.cast(source.schema) if out.schema != source.schema else out,
            (inner.io_bytes if inner else 0) + io.read_bytes + self.io.bytes,
            (inner.io_iops if inner else 0) + io.read_iops + self.io.reads,
            inner.rows_cached if inner else 0,
            inner.cache_damaged if inner else 0,
            decode_s,
            inner.cache_fills if inner else 0,
        )

    def _ranges(self, requests: list[tuple[int, int, int]]) -> dict[tuple[int, int, int], bytes]:
        """The bytes of each distinct ``(row offset, offset, length)`` of the blobs: in one
        ranged read, or with a cache, each range through ``cache.fetch_bytes`` (one download
        per range across threads and processes), the first missing one reading all the
        remaining ranges in one call (so a first epoch still makes one call per fetch, and a
        cached epoch none; a read partly cached may fetch a range twice, once)."""
        distinct = list(dict.fromkeys(requests))
        if not distinct:
            return {}

        def read(wanted: list[tuple[int, int, int]]) -> dict[tuple[int, int, int], bytes]:
            located = self.source.index.located
            found = None if located is None else located.read_ranges(wanted, self.io)
            if found is None:
                results = self.ds.read_blob_ranges(self.spec.column, wanted, selector="indices")
                found = [data for _, _, data in results]
            return dict(zip(wanted, found, strict=True))

        fetch = None if self.cache is None else self.cache.fetch_bytes
        if fetch is None:
            return read(distinct)
        fetched: dict[tuple[int, int, int], bytes] = {}

        def make(i: int) -> bytes:
            if distinct[i] not in fetched:
                fetched.update(read([r for r in distinct[i:] if r not in fetched]))
            return fetched.pop(distinct[i])

        return {
            r: fetch(
                f"blob-range {self.source.identity} {self.spec.column} {r[0]} {r[1]} {r[2]}",
                lambda i=i: make(i),
            )
            for i, r in enumerate(distinct)
        }

    def _infos(self, media: np.ndarray) -> dict[int, Any]:
        """The ``VideoInfo`` of each distinct media of a read, made from the index's Arrow rows
        (per read: nothing per video is kept in Python objects)."""
        video, unique = import_video(), np.unique(media)
        rows = self.source.index.table.take(pa.array(unique)).to_pylist()
        return {
            int(m): video.info_from_row(row, self.spec.column)
            for m, row in zip(unique.tolist(), rows, strict=True)
        }

    def _fetch_video(
        self,
        media: np.ndarray,
        offsets: np.ndarray,
        starts: np.ndarray,
        pool: concurrent.futures.ThreadPoolExecutor | None,
    ) -> VideoFetches:
        """Plan each clip's byte ranges and start fetching them on the read's fetch threads
        (``pool``: :func:`fetch_threads`; None for local media: one ranged read here), in up
        to :data:`FETCH_CHUNKS` ranged reads of consecutive
        clips, so the first clips decode while the later ones' bytes arrive."""
        spec = self.spec
        assert isinstance(spec, VideoClips)
        video, infos = import_video(), self._infos(media)
        sizes = self.source.index.table.column("size").to_numpy()
        clips = []
        for i, (m, offset, start) in enumerate(
            zip(media.tolist(), offsets.tolist(), starts.tolist(), strict=True)
        ):
            ranges = video.clip_byte_ranges(
                infos[m], int(sizes[m]), start, spec.frames, spec.stride
            )
            clips.append(
                PlannedClip(
                    [(offset, int(o), int(n)) for o, n in ranges],
                    infos[m],
                    int(sizes[m]),
                    Undecodable("video", i, m, offset, start),
                )
            )
        if pool is None:  # local media: one ranged read here, from the page cache
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(self._ranges([r for clip in clips for r in clip.ranges]))
            return VideoFetches(clips, [list(range(len(clips)))], [done])
        chunks, asked = fetch_chunks(len(clips)), set()
        futures = []
        for chunk in chunks:  # a range two chunks share (a video's header) is read once
            wanted = [r for i in chunk for r in clips[i].ranges if r not in asked]
            asked.update(wanted)
            futures.append(pool.submit(self._ranges, wanted))
        return VideoFetches(clips, chunks, futures)

    def _decode_fetched(self, fetches: VideoFetches) -> tuple[np.ndarray, float]:
        """Decode each clip of ``fetches`` into its place in the read's output (in the spec's
        layout) as soon as its chunk's bytes are there; and the seconds spent decoding."""
        video, out = import_video(), np.empty((len(fetches.clips), *self.source.shape), np.uint8)
        got: dict[tuple[int, int, int], bytes] = {}
        decode_s = 0.0
        for chunk, future in zip(fetches.chunks, fetches.futures, strict=True):
            got.update(fetches.wait(future))
            for i in chunk:
                clip = fetches.clips[i]
                parts = [(o, got[(offset, o, n)]) for offset, o, n in clip.ranges]
                decode_s += self._decode_video(
                    video, parts, clip.info, clip.size, clip.clip, out[i]
                )
        return out, decode_s

    def _decode_video(
        self,
        video: Any,
        parts: list[tuple[int, bytes]],
        info: Any,
        size: int,
        clip: Undecodable,
        out: np.ndarray,
    ) -> float:
        """One clip, decoded into ``out`` (its place in the read's output, in the spec's layout),
        serving a decoder's request for bytes outside its ranges with one more ranged read each
        (at most :data:`MAX_EXTRA_READS`); returns the seconds spent in the decoder."""
        spec, offset, start = self.spec, clip.offset, clip.start
        assert isinstance(spec, VideoClips)
        decode_s = 0.0
        for _ in range(MAX_EXTRA_READS + 1):
            began = time.perf_counter()
            try:
                video.decode_clip(
                    parts,
                    size,
                    info,
                    start,
                    spec.frames,
                    spec.stride,
                    resize=spec.size,
                    out=out,
                    channels_first=spec.layout == "NFCHW",
                )
                return decode_s + time.perf_counter() - began
            except video.MissingBytes as missing:
                decode_s += time.perf_counter() - began
                request = (offset, int(missing.offset), int(missing.length))
                parts = [*parts, (request[1], self._ranges([request])[request])]
                self.source.extra_reads += 1
            except NOT_READ_FAILURES:
                raise
            except Exception as exc:
                raise clip from exc
        raise clip from RuntimeError(
            f"the decoder asked for bytes outside the clip's ranges {MAX_EXTRA_READS + 1} times"
        )

    def _read_audio(
        self, media: np.ndarray, offsets: np.ndarray, starts: np.ndarray
    ) -> tuple[np.ndarray, float]:
        """Each window from only its bytes (``media/audio_ranges.py``: the header and the run
        of frames it spans; a file without a byte index whole), all in one ranged read; and
        the seconds spent decoding."""
        spec = self.spec
        assert isinstance(spec, AudioClips)
        ranges, unique = import_audio_ranges(), np.unique(media)
        found = ranges.indexes_from_table(
            self.source.index.table.take(pa.array(unique)), spec.column
        )
        indexes = dict(zip(unique.tolist(), found, strict=True))
        sizes = self.source.index.table.column("size").to_numpy()
        clips = list(zip(media.tolist(), offsets.tolist(), starts.tolist(), strict=True))
        wanted, lengths = [], []
        for m, offset, start in clips:
            info, index = indexes[m]
            lengths.append(round(spec.seconds * info.sample_rate))
            span = ranges.window_span(info, start, lengths[-1], spec.sample_rate)
            wanted.append(
                [(offset, o, n) for o, n in ranges.window_byte_ranges(index, int(sizes[m]), *span)]
            )
        got = self._ranges([r for clip in wanted for r in clip])
        windows = [  # decode_window_from_ranges's arguments: (offset, bytes) parts, info...
            ([(r[1], got[r]) for r in asked], *indexes[m], start, length)
            for asked, (m, _, start), length in zip(wanted, clips, lengths, strict=True)
        ]
        # the read's FLAC windows decode in one FFmpeg call per kind of file
        began = time.perf_counter()
        decoded = ranges.decode_flac_windows(windows, spec.sample_rate)
        out = np.empty((len(media), *self.source.shape), np.float32)
        for i, (m, offset, start) in enumerate(clips):
            try:
                out[i] = ranges.decode_window_from_ranges(
                    *windows[i],
                    sample_rate=spec.sample_rate,
                    channels=spec.channels,
                    decoded=decoded[i],
                )
            except NOT_READ_FAILURES:
                raise
            except Exception as exc:
                raise Undecodable("audio", i, m, offset, start) from exc
        return out, time.perf_counter() - began


def _named(rows: Any, where: np.ndarray) -> pa.Table | None:
    """The rows' columns of a read whose clip failed (they name it: its path), or ``None``."""
    if rows is None:
        return None
    try:
        return as_table(wait_fetched(rows).rows).take(pa.array(where))
    except Exception:  # the clip's error is the one to raise
        return None
