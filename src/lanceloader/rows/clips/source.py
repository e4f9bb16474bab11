"""Clips: a sample is a video clip or an audio window, not a row.

``Loader(uri, clips=ll.video_clips("video", frames=16))`` reads *clips* instead of the dataset's
rows. The windows are defined once, at construction, from each media row's length (the media
index, :mod:`lanceloader.rows.clips.index`: the ``{column}_frames`` index columns ``ll.convert``
writes, or a probe of every file once, cached beside the filter's plan with ``cache=`` a
directory, else kept in this process's memory), so they are the same in every epoch, on every
rank and in every process. Positions are clips: the order, plan, splits, filter, resume, N→M
ranks and mixing are the usual machinery.

This module is the stage: :func:`clip_source` and :class:`ClipSource` (construction, in the
Loader's process) and its reads (in the workers). Its helpers: ``rows/clips/windows.py`` (which
clips are the samples), ``rows/clips/index.py`` (the media index a ``ClipSource`` builds at
construction) and ``rows/clips/fetch.py`` (an object store's fetches); none imports this module.

What a clip is (:func:`clip_windows`, pure NumPy):

* ``video_clips(frames=F, stride=S, step=T)``: every window of ``F`` frames ``S`` apart that
  fits in a video, starting every ``T`` frames (default ``F × S``: clips do not overlap); a video
  shorter than one clip has none (counted in ``ClipSource.short_media``).
* ``video_clips(..., per_video=K)``: ``K`` clips per video per epoch, each starting at a frame
  drawn from ``(seed, epoch, position)`` (the Loader's ``seed``), so an epoch is the same
  whatever the workers, and a resume continues it exactly.
* ``audio_clips(seconds=s)``: the same for windows of audio (``step`` and ``per_file`` in
  seconds and windows).

What a read does (:meth:`ClipSource.read_rows`, in the worker that runs the read task: a
thread or a process worker): the row's other projected columns through the inner ``Source``
(one read, its cache included); for video, the byte ranges each clip needs
(:func:`lanceloader.media.video.clip_byte_ranges`: the container's header and the GOPs the clip
spans), then ``decode_clip`` per clip straight into its place in the read's output, in the
spec's layout (a ``MissingBytes`` is served by one more ranged read, counted in
``ClipSource.extra_reads``). Local media: the ranges in **one** ``read_blob_ranges`` call for
the whole read. On an object store the ranges are fetched on the read's own fetch threads
(:func:`fetch_threads`: I/O waits only) in up to :data:`FETCH_CHUNKS` calls of 1, 1, 2, 4...
clips (:func:`fetch_chunks`; a range two chunks share, a video's header, is read once), started
before the rows' columns are read, and each clip decodes as soon as its chunk is there: the
read's round trips overlap each other and its decodes instead of adding up (the rows'
columns are read on a fetch thread too, while the clips decode). On the emulated store
(+20 ms per request) the loader ran at ~0.6x its own local rate, and no faster with 4 workers
than with 2: the emulator (moto and the proxy, Python) took 18 ms of CPU per clip on the same
2 cores, beside the loader's 28 (benchmarks/multimodal.py). Bytes in flight: the read's own
clips' ranges, as with one call; a read waits at most :data:`FETCH_WAIT_S`.
For audio, likewise the bytes each window needs (:mod:`lanceloader.media.audio_ranges`: WAV by
arithmetic, FLAC and MP3 the header and the frames the window spans, other formats the whole
file) in one call, then ``decode_window_from_ranges``, sample-exact.

Output: ``column`` as a ``fixed_shape_tensor`` uint8 ``[F, C, H, W]`` (``layout="NFCHW"``) or
``[F, H, W, C]`` (``"NFHWC"``), which the output conversion makes ``[N, F, C, H, W]`` tensors;
audio ``[C, T]`` float32. Plus ``clip_start`` (the first frame, or sample at the file's own
rate) and the row's other projected columns.

With a cache (``cache=`` a directory or ``"memory"``; the automatic one only on an object
store, where it is decided here on the media's bytes), each byte range goes through
``cache.fetch_bytes`` (one download per range across threads and processes): an epoch whose
ranges are all cached makes no request.

Memory: a read holds its clips' encoded bytes (about 2 GOPs per clip, fetched or in flight)
and their decoded frames (``bytes_per_row`` = ``F × H × W × 3``, which sizes reads within the
engine's read bytes: 8 MiB, or up to 1,024 rows within 16 MiB); one decode holds one decoder
(PyAV: a few reference frames of the video's size, nothing kept between clips) and writes the
frames into the read's output (no copy after the colour conversion); the index is an Arrow
table of about ``videos × (2 × keyframes + 12) × 8`` bytes per process. Nothing grows with
the number of videos read.

Errors: a clip that fails to decode (a corrupt file) is a :class:`ClipError`, a ``ReadError``
naming the clip, the Lance row, its fragment, the row's text columns (its path) and the
decoder's error: it stops the epoch like any failed read. Not a skippable sample under
``on_error``, on purpose: a read delivers exactly one row per position (the rows protocol), and
a corrupt file is a fault of the data, the same every epoch, fixed once with a filter (e.g.
``filter="path != 'bad.mp4'"``) or by reconverting (``ll.convert`` lists and skips bad files).

Example::

    >>> windows = clip_windows(np.array([10, 3, 7]), frames=4, stride=1, step=4)
    >>> windows.num_clips, [windows.clip(p) for p in range(windows.num_clips)]
    (3, [(0, 0), (0, 4), (2, 0)])
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lanceloader.batch.transforms import tensor_array
from lanceloader.rows.cache.auto import auto_cache
from lanceloader.rows.cache.pieces import AUTO, MemoryCache
from lanceloader.rows.clips.fetch import (
    FETCH_CHUNKS,
    FETCH_WAIT_S,
    PlannedClip,
    Undecodable,
    VideoFetches,
    close_fetch_threads,
    fetch_chunks,
    fetch_threads,
    wait_fetched,
)
from lanceloader.rows.clips.index import (
    ClipError,
    MediaIndex,
    build_index,
    check_short_media,
    import_audio_ranges,
    import_video,
    index_names,
)
from lanceloader.rows.clips.windows import (
    LAYOUTS,
    AudioClips,
    Clips,
    ClipWindows,
    VideoClips,
    audio_clips,
    clip_windows,
    video_clips,
)
from lanceloader.rows.dataset import (
    NOT_READ_FAILURES,
    ReadError,
    check_columns,
    is_object_store,
    open_dataset,
)
from lanceloader.rows.lance.inline_blobs import take_inline_io
from lanceloader.rows.lance.source import Source
from lanceloader.rows.protocol import (
    Read,
    ReadHints,
    RowsBase,
    RowsFacts,
    as_table,
    empty_table,
)

# the stage's names, with those of two of its helper modules (importable here too); the media
# index's (MediaIndex, build_index, ClipError) are rows/clips/index.py's
__all__ = [
    "FETCH_CHUNKS",
    "FETCH_WAIT_S",
    "LAYOUTS",
    "AudioClips",
    "ClipSource",
    "ClipWindows",
    "Clips",
    "VideoClips",
    "audio_clips",
    "clip_source",
    "clip_windows",
    "close_fetch_threads",
    "fetch_chunks",
    "fetch_threads",
    "video_clips",
]

MAX_EXTRA_READS = 4  # ranged reads a clip may add when the decoder asks for more bytes




def clip_source(
    dataset: Any,
    spec: Clips,
    seed: int = 0,
    *,
    columns: list[str] | None = None,
    version: int | str | None = None,
    storage_options: dict[str, str] | None = None,
    **rows: Any,
) -> ClipSource:
    """The clips of ``dataset`` (a URI or ``lance.LanceDataset``) with the Source settings
    ``rows`` (filter, split, cache...): the inner source projects only the other columns a clip
    carries (``columns`` less the media column and its index), never the media itself, whose
    bytes are read by range."""
    if not isinstance(spec, VideoClips | AudioClips):
        raise TypeError(
            f"clips must come from ll.video_clips(...) or ll.audio_clips(...), got {spec!r}"
        )
    ds = open_dataset(dataset, version, storage_options)
    wanted = check_columns(columns, ds.schema)
    skip = {spec.column, *index_names(spec)}
    row_columns = [c for c in wanted if c not in skip]
    light = (
        [f"{spec.column}_frames"]
        if f"{spec.column}_frames" in ds.schema.names
        else [f.name for f in ds.schema if f.name not in skip and pa.types.is_primitive(f.type)][:1]
    )
    inner = Source(
        ds,
        columns=row_columns or light or [spec.column],
        version=version,
        storage_options=storage_options,
        **rows,
    )
    return ClipSource(inner, spec, seed, row_columns, auto=rows.get("cache", AUTO) == AUTO,
                      cache_size=rows.get("cache_size"))


def clips_cache(inner: Source, index: MediaIndex, auto: bool, cache_size: int | None
                ) -> tuple[Any, str]:
    """The cache the clips' byte ranges go through and why: the inner source's, or with the
    automatic cache a choice made again on what they hold, the media's bytes."""
    if auto:
        # The automatic cache decided on the rows' columns; the clips' byte ranges go through
        # it too, so decide again on what they can hold: the media's bytes. A clip is a few
        # ranged reads whatever the order, so only an object store (a round trip per request)
        # makes caching them pay; local ranges come from the page cache.
        media = int(pc.sum(index.table.column("size")).as_py() or 0)
        if is_object_store(inner.uri):
            return auto_cache(False, True, media + inner.bytes_per_row * inner.num_rows,
                              cache_size)
        return None, ("auto: none for the clips (local media are read by byte range; a cache "
                      "would only copy them)")
    return inner.cache, inner.cache_choice


# --- the rows -----------------------------------------------------------------------------


class ClipSource(RowsBase):
    """The clips of Lance rows' media (the rows protocol, :mod:`lanceloader.rows.protocol`): a
    view of one :class:`~lanceloader.rows.lance.source.Source`, whose positions are the media
    rows and whose dataset, version, filter and split it reports; position *p* is clip *p*.

    Built once per Loader: the index (:func:`~lanceloader.rows.clips.index.build_index`) and the
    windows (:func:`clip_windows`). Picklable (the index travels to process workers as Arrow;
    the decoder and the pinned dataset are opened in each process).

    Attributes: ``spec``, ``index`` (:class:`~lanceloader.rows.clips.index.MediaIndex`),
    ``windows``, ``short_media`` (media too short for one clip: they have none),
    ``extra_reads`` (ranged reads made after a decoder asked for bytes outside a clip's ranges,
    in this process).
    """

    def __init__(
        self,
        inner: Source,
        spec: Clips,
        seed: int = 0,
        row_columns: list[str] | None = None,
        *,
        auto: bool = False,
        cache_size: int | None = None,
    ) -> None:
        if not isinstance(spec, VideoClips | AudioClips):
            raise TypeError(
                f"clips must come from ll.video_clips(...) or ll.audio_clips(...), got {spec!r}"
            )
        if not isinstance(inner, Source):
            raise TypeError(
                f"clips: read the media of one Lance dataset (with its filter and "
                f"split), not {type(inner).__name__}; give each source of a mix its "
                "own Loader(..., clips=...)"
            )
        from lanceloader.rows.lance.blobs import is_blob_field

        schema = inner.schema
        if spec.column not in schema.names:
            raise KeyError(
                f"clips: column {spec.column!r} is not in the dataset (columns: "
                f"{schema.names}); name the media column, e.g. "
                f"ll.{spec.kind}_clips({schema.names[0]!r})"
            )
        if not is_blob_field(schema.field(spec.column)):
            raise TypeError(
                f"clips: column {spec.column!r} has type "
                f"{schema.field(spec.column).type}, not a Lance blob column; clips "
                "read byte ranges of blobs: write the files with "
                "ll.convert('videos/', out) (a blob column and its index)"
            )
        self.inner, self.spec, self.seed = inner, spec, seed
        self.index = build_index(inner, spec)
        self.dataset_name = inner.dataset_name
        self.cache, self.cache_choice = clips_cache(inner, self.index, auto, cache_size)
        skip = {spec.column, *index_names(spec)}
        self.row_columns = [
            c for c in (inner.columns if row_columns is None else row_columns) if c not in skip
        ]
        self.extra_reads = 0
        # On an object store a read's clips are fetched on the fetch threads while the rows'
        # columns are read and the first clips decode; local ranges come from the page cache.
        self.fetch_ahead = is_object_store(inner.uri)
        if isinstance(spec, VideoClips):
            self._shape = self._video_shape()
            lengths = self._index_column("frames")
            self.windows = clip_windows(
                lengths, spec.frames, spec.stride, spec.step, spec.per_video
            )
            dtype = pa.uint8()
        else:
            lengths, window, step, self._shape = self._audio_windows()
            self.windows = clip_windows(lengths, window, 1, step, spec.per_file)
            dtype = pa.float32()
        self.short_media = check_short_media(inner, spec, self.index, self.windows.counts)
        self.tensor = pa.fixed_shape_tensor(dtype, self._shape)
        row_schema = inner.schema_table().schema
        self.schema = pa.schema(
            [
                pa.field(spec.column, self.tensor),
                pa.field("clip_start", pa.int64()),
                *[row_schema.field(c) for c in self.row_columns],
            ]
        )
        self.columns = self.schema.names
        self.bytes_per_row = float(np.prod(self._shape) * (1 if dtype == pa.uint8() else 4))

    def _index_column(self, name: str) -> np.ndarray:
        col = self.index.table.column(f"{self.spec.column}_{name}")
        return col.to_numpy(zero_copy_only=False)

    def _video_shape(self) -> tuple[int, ...]:
        spec = self.spec
        assert isinstance(spec, VideoClips)
        if spec.size is not None:
            height, width = spec.size
        else:
            sizes = np.stack([self._index_column("height"), self._index_column("width")], 1)
            distinct = np.unique(sizes, axis=0) if len(sizes) else np.array([[0, 0]])
            if len(distinct) > 1:
                raise ValueError(
                    f"clips: the videos of column {spec.column!r} have {len(distinct)} frame "
                    f"sizes ({', '.join(f'{h}x{w}' for h, w in distinct[:4].tolist())}...), "
                    "and a batch is one tensor; pass video_clips(..., size=(height, width)) "
                    "to resize every frame"
                )
            height, width = (int(v) for v in distinct[0])
        if spec.layout == "NFCHW":
            return (spec.frames, 3, height, width)
        return (spec.frames, height, width, 3)

    def _audio_windows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
        spec = self.spec
        assert isinstance(spec, AudioClips)
        rates = self._index_column("sample_rate").astype(np.int64)
        window = np.round(spec.seconds * rates).astype(np.int64)
        step = np.round((spec.step or spec.seconds) * rates).astype(np.int64)
        out = (
            np.round(window * spec.sample_rate / rates).astype(np.int64)
            if spec.sample_rate
            else window
        )
        channels = self._index_column("channels").astype(np.int64)
        for what, values, fix in (
            ("sample rates", out if spec.sample_rate else rates, "sample_rate=16000"),
            (
                "channel counts",
                channels if spec.channels is None else np.zeros(0, np.int64),
                "channels=1",
            ),
        ):
            if len(np.unique(values)) > 1:
                raise ValueError(
                    f"clips: the files of column {spec.column!r} have "
                    f"{len(np.unique(values))} {what} "
                    f"({np.unique(values)[:4].tolist()}...), and a batch is one "
                    f"tensor; pass audio_clips(..., {fix})"
                )
        length = int(out[0]) if len(out) else round(spec.seconds * (spec.sample_rate or 1))
        c = spec.channels or (int(channels[0]) if len(channels) else 1)
        return self._index_column("frames").astype(np.int64), window, step, (c, length)

    # --- the protocol ---------------------------------------------------------------------

    @property
    def num_rows(self) -> int:
        return self.windows.num_clips

    def settings(self) -> dict[str, Any]:
        """The inner source's settings and the clips' (a state of other clips is refused)."""
        return {**self.inner.settings(), "clips": self.spec.settings()}

    @property
    def hints(self) -> ReadHints:
        """Clips are in storage order of their media; their ranges go through a cache if any."""
        return ReadHints(cached=self.cache is not None)

    @property
    def facts(self) -> RowsFacts:
        inner = self.inner.facts
        return RowsFacts(cache_choice=self.cache_choice,
                         cache_per_process=isinstance(self.cache, MemoryCache),
                         plan_origin=inner.plan_origin, short_media=self.short_media)

    def lineage(self, positions: np.ndarray, epoch: int = 0) -> dict[str, Any]:
        """The ledger's columns: the media row's (offset and id), and each clip's first frame
        (audio: sample, at the file's own rate), drawn for ``epoch`` where clips are
        ``per_video``/``per_file``."""
        positions = np.asarray(positions, np.int64)
        return {**self.inner.lineage(self.windows.media(positions), epoch),
                "position": positions,
                "clip_start": self.windows.starts(positions, self.seed, epoch)}

    def schema_table(self) -> pa.Table:
        return empty_table(self.schema)

    def describe_rows(self, positions: np.ndarray) -> str:
        positions = np.asarray(positions, dtype=np.int64)[:4]
        media = self.windows.media(positions)
        return (
            f"clips {positions.tolist()} (media at positions {media.tolist()}: "
            f"{self.inner.describe_rows(np.unique(media))})"
        )

    def __repr__(self) -> str:
        return (
            f"ClipSource({self.inner!r}, {self.spec}, clips={self.num_rows}, "
            f"index={self.index.origin})"
        )

    def read_rows(self, positions: np.ndarray, epoch: int = 0) -> Read:
        """The clips at ``positions`` (in that order) for ``epoch`` (which draws the starts of
        ``per_video`` clips): the rows' other columns through the inner source, the media
        bytes in one ranged blob read, decoded here (see the module's text)."""
        positions = np.asarray(positions, dtype=np.int64)
        if not len(positions):  # no clips: no decoder (Arrow makes no empty tensor of NumPy)
            return Read(self.schema_table())
        media = self.windows.media(positions)
        starts = self.windows.starts(positions, self.seed, epoch)
        columns: dict[str, Any] = {}
        io_bytes = io_iops = cached = damaged = 0
        table = None
        ds = self.inner.dataset
        offsets = self.inner.row_offsets(media)
        fetches = rows = None
        unique, where = np.unique(media, return_inverse=True)
        # an object store's fetches wait on threads of this read's own, shut down below
        pool = fetch_threads() if self.fetch_ahead and isinstance(self.spec, VideoClips) else None
        done = False
        try:
            if isinstance(self.spec, VideoClips):
                # the clips' bytes are on their way while the rows' columns are read
                fetches = self._fetch_video(ds, media, offsets, starts, pool)
            if self.row_columns:
                if pool is not None:  # read while the clips decode
                    rows = pool.submit(self.inner.read_rows, unique, epoch)
                else:
                    rows = concurrent.futures.Future()
                    rows.set_result(self.inner.read_rows(unique, epoch))
            if fetches is not None:
                clips, decode_s = self._decode_fetched(ds, fetches)
            else:
                clips, decode_s = self._read_audio(ds, media, offsets, starts)
            if rows is not None:
                read = wait_fetched(rows)
                table = as_table(read.rows).select(self.row_columns).take(pa.array(where))
                columns = {c: table.column(c) for c in self.row_columns}
                io_bytes, io_iops = read.io_bytes, read.io_iops
                cached, damaged = read.rows_cached, read.cache_damaged
            io = ds.io_stats_incremental()  # Lance's I/O since the last read took its count
            local_bytes, local_reads = take_inline_io()  # ranges read past Lance (blob_files)
            done = True
        except Undecodable as bad:
            if table is None and rows is not None:  # the row's columns name it (its path)
                try:
                    table = as_table(wait_fetched(rows).rows).take(pa.array(where))
                except Exception:  # the clip's error is the one to raise
                    table = None
            raise self._clip_error(bad, table) from bad.__cause__
        except (ReadError, *NOT_READ_FAILURES):
            raise
        except BaseException as exc:
            raise self.inner.read_error(exc, media) from exc
        finally:
            if fetches is not None:
                fetches.cancel()
            if rows is not None:
                rows.cancel()
            if pool is not None:
                close_fetch_threads(pool, done)
        out = pa.table(
            {
                self.spec.column: tensor_array(clips),
                "clip_start": pa.array(starts, pa.int64()),
                **columns,
            }
        )
        return Read(
            out.cast(self.schema) if out.schema != self.schema else out,
            io_bytes + io.read_bytes + local_bytes,
            io_iops + io.read_iops + local_reads,
            cached,
            damaged,
            decode_s,
        )

    def _ranges(
        self, ds: Any, requests: list[tuple[int, int, int]]
    ) -> dict[tuple[int, int, int], bytes]:
        """The bytes of each distinct ``(row offset, offset, length)`` of the blobs: in one
        ranged read, or with a cache, each range through ``cache.fetch_bytes`` (one download
        per range across threads and processes), the first missing one reading all the
        remaining ranges in one call (so a first epoch still makes one call per fetch, and a
        cached epoch none; a read partly cached may fetch a range twice, once)."""
        distinct = list(dict.fromkeys(requests))
        if not distinct:
            return {}

        def read(wanted: list[tuple[int, int, int]]) -> dict[tuple[int, int, int], bytes]:
            located = self.index.located
            found = None if located is None else located.read_ranges(wanted)
            if found is None:
                results = ds.read_blob_ranges(self.spec.column, wanted, selector="indices")
                found = [data for _, _, data in results]
            return dict(zip(wanted, found, strict=True))

        fetch = getattr(self.cache, "fetch_bytes", None)
        if fetch is None:
            return read(distinct)
        fetched: dict[tuple[int, int, int], bytes] = {}

        def make(i: int) -> bytes:
            if distinct[i] not in fetched:
                fetched.update(read([r for r in distinct[i:] if r not in fetched]))
            return fetched.pop(distinct[i])

        return {
            r: fetch(
                f"blob-range {self.identity} {self.spec.column} {r[0]} {r[1]} {r[2]}",
                lambda i=i: make(i),
            )
            for i, r in enumerate(distinct)
        }

    def _infos(self, media: np.ndarray) -> dict[int, Any]:
        """The ``VideoInfo`` of each distinct media of a read, made from the index's Arrow rows
        (per read: nothing per video is kept in Python objects)."""
        video, unique = import_video(), np.unique(media)
        rows = self.index.table.take(pa.array(unique)).to_pylist()
        return {
            int(m): video.info_from_row(row, self.spec.column)
            for m, row in zip(unique.tolist(), rows, strict=True)
        }

    def _fetch_video(
        self,
        ds: Any,
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
        sizes = self.index.table.column("size").to_numpy()
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
            done.set_result(self._ranges(ds, [r for clip in clips for r in clip.ranges]))
            return VideoFetches(clips, [list(range(len(clips)))], [done])
        chunks, asked = fetch_chunks(len(clips)), set()
        futures = []
        for chunk in chunks:  # a range two chunks share (a video's header) is read once
            wanted = [r for i in chunk for r in clips[i].ranges if r not in asked]
            asked.update(wanted)
            futures.append(pool.submit(self._ranges, ds, wanted))
        return VideoFetches(clips, chunks, futures)

    def _decode_fetched(self, ds: Any, fetches: VideoFetches) -> tuple[np.ndarray, float]:
        """Decode each clip of ``fetches`` into its place in the read's output (in the spec's
        layout) as soon as its chunk's bytes are there; and the seconds spent decoding."""
        video, out = import_video(), np.empty((len(fetches.clips), *self._shape), np.uint8)
        got: dict[tuple[int, int, int], bytes] = {}
        decode_s = 0.0
        for chunk, future in zip(fetches.chunks, fetches.futures, strict=True):
            got.update(fetches.wait(future))
            for i in chunk:
                clip = fetches.clips[i]
                parts = [(o, got[(offset, o, n)]) for offset, o, n in clip.ranges]
                decode_s += self._decode_video(ds, video, parts, clip.info, clip.size,
                                               clip.clip, out[i])
        return out, decode_s

    def _decode_video(
        self,
        ds: Any,
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
                parts = [*parts, (request[1], self._ranges(ds, [request])[request])]
                self.extra_reads += 1
            except NOT_READ_FAILURES:
                raise
            except Exception as exc:
                raise clip from exc
        raise clip from RuntimeError(
            f"the decoder asked for bytes outside the clip's ranges {MAX_EXTRA_READS + 1} times"
        )

    def _read_audio(
        self, ds: Any, media: np.ndarray, offsets: np.ndarray, starts: np.ndarray
    ) -> tuple[np.ndarray, float]:
        """Each window from only its bytes (``media/audio_ranges.py``: the header and the run
        of frames it spans; a file without a byte index whole), all in one ranged read; and
        the seconds spent decoding."""
        spec = self.spec
        assert isinstance(spec, AudioClips)
        ranges, unique = import_audio_ranges(), np.unique(media)
        found = ranges.indexes_from_table(self.index.table.take(pa.array(unique)), spec.column)
        indexes = dict(zip(unique.tolist(), found, strict=True))
        sizes = self.index.table.column("size").to_numpy()
        clips = list(zip(media.tolist(), offsets.tolist(), starts.tolist(), strict=True))
        wanted, lengths = [], []
        for m, offset, start in clips:
            info, index = indexes[m]
            lengths.append(round(spec.seconds * info.sample_rate))
            span = ranges.window_span(info, start, lengths[-1], spec.sample_rate)
            wanted.append(
                [(offset, o, n) for o, n in ranges.window_byte_ranges(index, int(sizes[m]), *span)]
            )
        got = self._ranges(ds, [r for clip in wanted for r in clip])
        windows = [  # decode_window_from_ranges's arguments: (offset, bytes) parts, info...
            ([(r[1], got[r]) for r in asked], *indexes[m], start, length)
            for asked, (m, _, start), length in zip(wanted, clips, lengths, strict=True)
        ]
        # the read's FLAC windows decode in one FFmpeg call per kind of file
        began = time.perf_counter()
        decoded = ranges.decode_flac_windows(windows, spec.sample_rate)
        out = np.empty((len(media), *self._shape), np.float32)
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

    def _clip_error(self, bad: Undecodable, table: pa.Table | None) -> ClipError:
        """The error for a clip that failed to decode, naming the clip, its row (with the
        row's text columns, such as its path) and the decoder's error."""
        exc = bad.__cause__
        where = self.inner.describe_offsets(np.array([bad.offset]))
        unit = "frame" if bad.kind == "video" else "sample"
        values = (
            ""
            if table is None
            else "".join(
                f", {name}={table.column(name)[bad.clip].as_py()!r}"
                for name in self.row_columns
                if pa.types.is_string(table.schema.field(name).type)
                or pa.types.is_large_string(table.schema.field(name).type)
            )
        )
        return ClipError(
            f"the {bad.kind} clip from {unit} {bad.start} of Lance row {bad.offset} (media "
            f"position {bad.position}; {where}{values}) of {self.uri!r} (version "
            f"{self.version}) could not be decoded: {type(exc).__name__}: {exc}. A corrupt "
            "file: leave its row out with "
            "filter= (e.g. on its path column), or reconvert the files with ll.convert, "
            "which lists and skips unreadable ones"
        )
