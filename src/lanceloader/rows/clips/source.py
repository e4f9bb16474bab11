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
columns are read on a fetch thread too, while the clips decode; what this gave on an emulated
store: docs/performance.md, "Clips on an object store"). Bytes in flight: the read's own
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

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lanceloader.rows.cache.auto import auto_cache
from lanceloader.rows.cache.pieces import AUTO, MemoryCache
from lanceloader.rows.clips.fetch import (
    FETCH_CHUNKS,
    FETCH_WAIT_S,
    Undecodable,
    close_fetch_threads,
    fetch_chunks,
    fetch_threads,
)
from lanceloader.rows.clips.index import (
    ClipError,
    MediaIndex,
    build_index,
    check_short_media,
    index_names,
)
from lanceloader.rows.clips.read import ClipRead
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
from lanceloader.rows.dataset import check_columns, open_dataset
from lanceloader.rows.lance.source import Source
from lanceloader.rows.protocol import Read, ReadHints, RowsBase, RowsFacts, empty_table
from lanceloader.rows.store import is_object_store

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
    return ClipSource(
        inner,
        spec,
        seed,
        row_columns,
        auto=rows.get("cache", AUTO) == AUTO,
        cache_size=rows.get("cache_size"),
    )


def clips_cache(
    inner: Source, index: MediaIndex, auto: bool, cache_size: int | None
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
            return auto_cache(False, True, media + inner.bytes_per_row * inner.num_rows, cache_size)
        return None, (
            "auto: none for the clips (local media are read by byte range; a cache "
            "would only copy them)"
        )
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
            self.shape = self._video_shape()
            lengths = self._index_column("frames")
            self.windows = clip_windows(
                lengths, spec.frames, spec.stride, spec.step, spec.per_video
            )
            dtype = pa.uint8()
        else:
            lengths, window, step, self.shape = self._audio_windows()
            self.windows = clip_windows(lengths, window, 1, step, spec.per_file)
            dtype = pa.float32()
        self.short_media = check_short_media(inner, spec, self.index, self.windows.counts)
        self.tensor = pa.fixed_shape_tensor(dtype, self.shape)
        row_schema = inner.schema_table().schema
        self.schema = pa.schema(
            [
                pa.field(spec.column, self.tensor),
                pa.field("clip_start", pa.int64()),
                *[row_schema.field(c) for c in self.row_columns],
            ]
        )
        self.columns = self.schema.names
        self.bytes_per_row = float(np.prod(self.shape) * (1 if dtype == pa.uint8() else 4))

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
        """Clips are in storage order of their media; their ranges go through a cache if any;
        each is decoded in the read (a 60 ms step of 4 clips went unfed with reads of 21
        batches: docs/performance.md, "Feeding a step")."""
        return ReadHints(cached=self.cache is not None, decodes=True)

    @property
    def facts(self) -> RowsFacts:
        inner = self.inner.facts
        return RowsFacts(
            cache_choice=self.cache_choice,
            cache_per_process=isinstance(self.cache, MemoryCache),
            plan_origin=inner.plan_origin,
            short_media=self.short_media,
        )

    def blob_files(self, column: str, offsets: pa.Array, buffer_size: int) -> list[Any]:
        """The media rows' other blob columns read as files (the inner Lance rows')."""
        return self.inner.blob_files(column, offsets, buffer_size)

    def lineage(self, positions: np.ndarray, epoch: int = 0) -> dict[str, Any]:
        """The ledger's columns: the media row's (offset and id), and each clip's first frame
        (audio: sample, at the file's own rate), drawn for ``epoch`` where clips are
        ``per_video``/``per_file``."""
        positions = np.asarray(positions, np.int64)
        return {
            **self.inner.lineage(self.windows.media(positions), epoch),
            "position": positions,
            "clip_start": self.windows.starts(positions, self.seed, epoch),
        }

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
        bytes in one ranged blob read, decoded here (see the module's text and
        :class:`~lanceloader.rows.clips.read.ClipRead`)."""
        positions = np.asarray(positions, dtype=np.int64)
        if not len(positions):  # no clips: no decoder (Arrow makes no empty tensor of NumPy)
            return Read(self.schema_table())
        return ClipRead(self, self.inner.dataset).read(positions, epoch)

    def clip_error(self, bad: Undecodable, table: pa.Table | None) -> ClipError:
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
