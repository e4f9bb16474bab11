"""Clips as samples (``Loader(clips=ll.video_clips(...))``, ``rows/clips/source.py``): real videos made
by ``tests/mediagen.py`` (every frame carries its index in its pixels) in real Lance datasets
with a blob column, read on local disk and on the loopback S3 server; frames compared with a
whole-file reference decode; orders, filters, splits, resume, ranks and mixes through the usual
machinery.
"""

from __future__ import annotations

import collections
import shutil
import time

import lance
import lance.blob
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lanceloader as ll
from checkpointing import assert_checkpoint_conformance
from conftest import lanceloader_threads
from lanceloader.media import video as media_video
from lanceloader.rows.clips.fetch import fetch_chunks
from lanceloader.rows.clips.source import ClipSource
from lanceloader.rows.clips.windows import clip_windows, draw_below
from mediagen import frame_index_of, write_audio, write_video

FRAMES = [30, 21, 45, 9, 26]  # per video; the 9-frame one is too short for some clips
SIZE = (48, 64)
SPEC = {"frames": 4, "stride": 2, "step": 5}


def video_table(datas: list[bytes], index: bool = True) -> pa.Table:
    """Rows of videos: a blob column, label, episode, path and (``index``) the keyframe index."""
    n = len(datas)
    table = pa.table(
        {
            "label": pa.array([i % 3 for i in range(n)], pa.int64()),
            "episode": pa.array([f"ep{i}" for i in range(n)]),
            "path": pa.array([f"v{i}.mp4" for i in range(n)]),
            "video": lance.blob.blob_array(datas),
        }
    )
    if index:
        rows = [media_video.index_values(media_video.probe_video(d), "video") for d in datas]
        columns = pa.Table.from_pylist(rows, schema=pa.schema(media_video.index_fields("video")))
        for name in columns.column_names:
            table = table.append_column(name, columns.column(name))
    return table


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    folder = tmp_path_factory.mktemp("videos")
    return [
        write_video(folder / f"v{i}.mp4", n, 12, SIZE, gop=6).read_bytes()
        for i, n in enumerate(FRAMES)
    ]


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory, videos: list[bytes]) -> str:
    out = str(tmp_path_factory.mktemp("clips") / "videos.lance")
    lance.write_dataset(video_table(videos), out, data_storage_version="2.2", max_rows_per_file=2)
    return out


@pytest.fixture(scope="module")
def bare_uri(tmp_path_factory: pytest.TempPathFactory, videos: list[bytes]) -> str:
    """The same videos without the index columns (a dataset not written by ll.convert)."""
    out = str(tmp_path_factory.mktemp("bare") / "videos.lance")
    lance.write_dataset(video_table(videos, index=False), out, data_storage_version="2.2")
    return out


def clips_of(loader: ll.Loader) -> list[tuple[str, int, list[int]]]:
    """(path, clip_start, frame indexes read from the pixels) of every clip of one epoch."""
    out = []
    for batch in loader:
        for path, start, clip in zip(
            list(batch["path"]), batch["clip_start"].tolist(), batch["video"], strict=True
        ):
            out.append((path, start, [frame_index_of(f.transpose(1, 2, 0)) for f in clip]))
    return out


ALL_VIDEOS = range(len(FRAMES))


def expected_clips(
    frames: int, stride: int, step: int, kept=ALL_VIDEOS
) -> list[tuple[str, int, list[int]]]:
    span = (frames - 1) * stride + 1
    return [
        (f"v{v}.mp4", s, [s + stride * k for k in range(frames)])
        for v in kept
        for s in range(0, FRAMES[v] - span + 1, step)
    ]


# --- windows (pure) -------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 60), max_size=8),
    frames=st.integers(1, 8),
    stride=st.integers(1, 4),
    step=st.one_of(st.none(), st.integers(1, 9)),
)
def test_windows_are_every_clip_that_fits_once(lengths, frames, stride, step) -> None:
    windows = clip_windows(np.array(lengths, np.int64), frames, stride, step)
    span, every = (frames - 1) * stride + 1, step or frames * stride
    want = [(m, s) for m, n in enumerate(lengths) for s in range(0, n - span + 1, every)]
    assert [windows.clip(p) for p in range(windows.num_clips)] == want


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    k=st.integers(1, 4),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 5),
)
def test_per_video_starts_lie_in_their_video_and_follow_seed_and_epoch(
    lengths, k, seed, epoch
) -> None:
    windows = clip_windows(np.array(lengths), frames=3, stride=2, per_media=k)
    positions = np.arange(windows.num_clips)
    starts = windows.starts(positions, seed, epoch)
    media = windows.media(positions)
    assert np.all(np.bincount(media, minlength=len(lengths)) == windows.counts)
    assert np.all((starts >= 0) & (starts + 4 < np.array(lengths)[media]))
    # any subset of positions draws the same starts (what workers and resumes rely on)
    assert np.array_equal(windows.starts(positions[::-1], seed, epoch), starts[::-1])


@settings(max_examples=40, deadline=None)
@given(clips=st.integers(0, 70), most=st.integers(1, 6))
def test_a_reads_clips_are_fetched_in_order_in_few_chunks_the_first_alone(clips, most) -> None:
    chunks = fetch_chunks(clips, most)
    assert [i for chunk in chunks for i in chunk] == list(range(clips))  # each once, in order
    assert len(chunks) <= most and all(chunks)
    if clips and most > 1:
        assert len(chunks[0]) == 1  # the first decode waits for one clip's bytes only
        sizes = [len(c) for c in chunks[:-1]]
        assert sizes == sorted(sizes)  # later chunks have more decodes before them to arrive in


# --- frames -------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["NFCHW", "NFHWC"])
def test_every_clip_equals_the_reference_decode_of_the_whole_file(uri, videos, layout) -> None:
    loader = ll.Loader(
        uri, batch_size=4, num_workers=2, clips=ll.video_clips("video", layout=layout, **SPEC)
    )
    assert loader.source.index.origin == "columns"
    seen = 0
    for batch in loader:
        for path, start, clip in zip(
            list(batch["path"]), batch["clip_start"].tolist(), batch["video"], strict=True
        ):
            data = videos[int(path[1:-4])]
            want = media_video.decode_whole(data, start, SPEC["frames"], SPEC["stride"])
            got = clip.transpose(0, 2, 3, 1) if layout == "NFCHW" else clip
            assert np.array_equal(got, want), (path, start)
            seen += 1
    assert seen == len(expected_clips(**SPEC)) == loader.source.num_rows


def test_a_dataset_without_the_index_is_probed_once_and_cached(bare_uri, uri, tmp_path) -> None:
    cache = str(tmp_path / "cache")
    first = ll.Loader(bare_uri, batch_size=4, clips=ll.video_clips(**SPEC), cache=cache)
    again = ll.Loader(bare_uri, batch_size=4, clips=ll.video_clips(**SPEC), cache=cache)
    assert first.source.index.origin == "probe" and first.source.index.probed_bytes > 0
    assert again.source.index.origin == "cache"
    assert (
        clips_of(again)
        == clips_of(first)
        == clips_of(ll.Loader(uri, batch_size=4, clips=ll.video_clips(**SPEC)))
    )


def test_resize_gives_the_asked_size_and_the_same_frames(uri) -> None:
    loader = ll.Loader(
        uri, batch_size=8, output="torch", clips=ll.video_clips(frames=3, size=(24, 32))
    )
    batch = next(iter(loader))
    assert tuple(batch["video"].shape) == (8, 3, 3, 24, 32)
    assert [frame_index_of(f.permute(1, 2, 0).numpy()) for f in batch["video"][1]] == [3, 4, 5]


# --- the usual machinery ----------------------------------------------------------------


ORDERS = {
    "sequential": {},
    "block": {"shuffle": True, "shuffle_block_size": 3},
    "full": {"shuffle": True},
}


def test_clip_reads_hold_a_few_batches_as_a_transforms_do(uri) -> None:
    """Clips are decoded in the read, so a read's first batch waits for the whole read: reads
    of many batches by bytes (21 batches of 4 clips in benchmarks/step.py) left a 60 ms step
    unfed at the start of each read; like a transform's, reads hold at most two batches."""
    for spec in (ll.video_clips(frames=2, size=(4, 4)), ll.video_clips(**SPEC)):
        loader = ll.Loader(uri, batch_size=1, clips=spec, **ORDERS["block"])
        assert loader.batches_per_read <= 2, loader.batches_per_read
    rows = ll.Loader(uri, batch_size=1)
    assert rows.batches_per_read > 2  # plain rows: by bytes


@pytest.mark.parametrize("order", list(ORDERS))
def test_every_order_delivers_every_clip_once_per_epoch(uri, order) -> None:
    loader = ll.Loader(
        uri, batch_size=3, num_workers=2, seed=5, clips=ll.video_clips(**SPEC), **ORDERS[order]
    )
    want = sorted(expected_clips(**SPEC))
    epochs = [clips_of(loader) for _ in range(2)]
    assert [sorted(e) for e in epochs] == [want, want]
    if order != "sequential":
        assert epochs[0] != epochs[1]  # each epoch its own order


def test_a_filter_and_a_split_choose_the_videos(uri) -> None:
    filtered = clips_of(
        ll.Loader(uri, batch_size=4, filter="label != 1", clips=ll.video_clips(**SPEC))
    )
    assert filtered == expected_clips(**SPEC, kept=[0, 2, 3])
    splits = {"train": 0.6, "val": 0.4}
    parts = [
        clips_of(ll.Loader(uri, batch_size=4, splits=splits, split=s, clips=ll.video_clips(**SPEC)))
        for s in splits
    ]
    assert sorted(parts[0] + parts[1]) == sorted(expected_clips(**SPEC))
    assert not {p for p, _, _ in parts[0]} & {p for p, _, _ in parts[1]}  # by video


def test_resume_at_every_step_gives_the_uninterrupted_clips(uri) -> None:
    assert_checkpoint_conformance(
        lambda: ll.Loader(
            uri,
            batch_size=3,
            shuffle=True,
            seed=2,
            num_workers=2,
            clips=ll.video_clips(frames=2, stride=3, per_video=2),
        ),
        value=lambda b: (list(b["path"]), b["clip_start"].tolist()),
    )


def test_two_ranks_resumed_on_three_give_the_uninterrupted_clips(uri) -> None:
    opts = {
        "batch_size": 2,
        "shuffle": True,
        "seed": 1,
        "drop_last": True,
        "clips": ll.video_clips(**SPEC),
    }

    def key(batch) -> list[tuple[str, int]]:
        return list(zip(list(batch["path"]), batch["clip_start"].tolist(), strict=True))

    whole = ll.Loader(uri, **opts)
    everything = [c for b in whole for c in key(b)]
    ranks = [ll.Loader(uri, rank=r, world_size=2, **opts) for r in range(2)]
    iterators = [iter(loader) for loader in ranks]
    seen = [c for _ in range(2) for it in iterators for c in key(next(it))]
    state = ranks[0].state_dict()
    later = [ll.Loader(uri, rank=r, world_size=3, **opts) for r in range(3)]
    for loader in later:
        loader.load_state_dict(state)
    rest = [
        c
        for batches in zip(*[list(loader) for loader in later], strict=True)
        for b in batches
        for c in key(b)
    ]
    assert seen + rest == everything[: len(seen) + len(rest)]
    assert len(everything) - len(seen) - len(rest) < 6  # only the dropped last global batch


def test_per_video_clips_are_deterministic_in_seed_and_epoch(uri) -> None:
    def epochs(seed: int, workers: int) -> list[list[tuple[str, int, list[int]]]]:
        loader = ll.Loader(
            uri,
            batch_size=4,
            seed=seed,
            num_workers=workers,
            clips=ll.video_clips(frames=3, per_video=3),
        )
        return [clips_of(loader) for _ in range(2)]

    a, b = epochs(7, 1), epochs(7, 2)
    assert a == b
    assert a[0] != a[1] and a[0] != epochs(8, 1)[0]
    for epoch in a:
        assert collections.Counter(p for p, _, _ in epoch) == {
            f"v{v}.mp4": 3 for v, n in enumerate(FRAMES) if n >= 3
        }
        assert all(frames == [s, s + 1, s + 2] for _, s, frames in epoch)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 2**40), min_size=1, max_size=50),
    st.integers(0, 2**63),
    st.integers(0, 1000),
)
def test_random_clip_starts_lie_in_their_range_and_depend_on_seed_epoch_position(
    bounds, seed, epoch
) -> None:
    """draw_below: each start in [0, bound), the same for the same (seed, epoch, position)
    wherever it is drawn (alone or among others), and spread over the range."""
    bounds = np.array(bounds)
    positions = np.arange(len(bounds)) * 7 + 3
    starts = draw_below(bounds, positions, seed, epoch)
    assert ((starts >= 0) & (starts < bounds)).all()
    alone = [
        int(draw_below(bounds[i : i + 1], positions[i : i + 1], seed, epoch)[0])
        for i in range(len(bounds))
    ]
    assert starts.tolist() == alone
    many = draw_below(np.full(20_000, 10), np.arange(20_000), seed, epoch)
    assert np.bincount(many, minlength=10).min() > 1_700  # ~2,000 each: no bin starved
    assert (
        many != draw_below(np.full(20_000, 10), np.arange(20_000), seed, epoch + 1)
    ).mean() > 0.8


def test_a_state_of_other_clips_is_refused(uri) -> None:
    loader = ll.Loader(uri, batch_size=2, clips=ll.video_clips(frames=4))
    next(iter(loader))
    other = ll.Loader(uri, batch_size=2, clips=ll.video_clips(frames=5))
    with pytest.raises(ll.StateMismatchError):
        other.load_state_dict(loader.state_dict())


def test_a_mix_of_clip_loaders_interleaves_their_clips(uri) -> None:
    a = ll.Loader(uri, filter="label = 0", clips=ll.video_clips(**SPEC))
    b = ll.Loader(uri, filter="label = 2", clips=ll.video_clips(**SPEC), shuffle=True)
    mixed = ll.Loader(ll.Mix({"a": a, "b": b}, weights={"a": 1, "b": 1}), batch_size=2)
    got = clips_of(mixed)
    assert got and all(frames == [s + 2 * k for k in range(4)] for _, s, frames in got)
    paths = {p for p, _, _ in got}
    assert paths <= {"v0.mp4", "v3.mp4", "v2.mp4"} and {"v0.mp4", "v2.mp4"} <= paths


def test_process_workers_deliver_what_threads_do(uri) -> None:
    settings = {"batch_size": 4, "shuffle": True, "clips": ll.video_clips(**SPEC)}
    threads = clips_of(ll.Loader(uri, num_workers=2, **settings))
    assert clips_of(ll.Loader(uri, num_workers=2, worker_type="process", **settings)) == threads


def test_torch_datasets_read_the_loaders_clips(uri) -> None:
    torch = pytest.importorskip("torch")
    from lanceloader.torch import IterableDataset, MapDataset, collate

    spec = ll.video_clips(**SPEC)
    want = next(iter(ll.Loader(uri, batch_size=5, clips=spec, output="torch")))
    mapped = collate(MapDataset(uri, clips=spec).__getitems__(list(range(5))))
    streamed = next(
        iter(
            torch.utils.data.DataLoader(
                IterableDataset(uri, batch_size=5, clips=spec, output="torch"), batch_size=None
            )
        )
    )
    for got in (mapped, streamed):
        assert torch.equal(got["video"], want["video"])
        assert got["clip_start"].tolist() == want["clip_start"].tolist()
    with pytest.raises(ValueError, match="per_video"):
        MapDataset(uri, clips=ll.video_clips(per_video=2))


# --- object storage -----------------------------------------------------------------------


def test_s3_gives_the_local_clips_in_at_most_three_gets_per_clip(s3, uri, videos) -> None:
    remote = s3.write(video_table(videos), data_storage_version="2.2", max_rows_per_file=2)
    settings = {"batch_size": 4, "shuffle": True, "clips": ll.video_clips(**SPEC), "cache": None}
    loader = ll.Loader(remote, storage_options=s3.storage_options, **settings)
    s3.requests(reset=True)
    got = clips_of(loader)
    gets = s3.requests().get("GET", 0)
    assert got == clips_of(ll.Loader(uri, **settings))
    assert 0 < gets <= 3 * len(got), f"{gets} GETs for {len(got)} clips"
    assert lanceloader_threads() == []  # each read's fetch threads end with the read


def test_the_second_epoch_through_a_cache_makes_no_request(s3, videos, tmp_path) -> None:
    remote = s3.write(video_table(videos), data_storage_version="2.2")
    gets = {}
    for cache in (None, str(tmp_path / "cache"), "auto"):
        loader = ll.Loader(
            remote,
            storage_options=s3.storage_options,
            batch_size=4,
            shuffle=True,
            cache=cache,
            clips=ll.video_clips(**SPEC),
        )
        first = clips_of(loader)
        s3.requests(reset=True)
        second = clips_of(loader)
        gets[cache] = s3.requests().get("GET", 0)
        assert sorted(second) == sorted(first) == sorted(expected_clips(**SPEC))
    # the ranges come from the cache: given, or the automatic one on an object store
    assert gets[None] > 0 and list(gets.values())[1:] == [0, 0], gets


def test_the_automatic_cache_keeps_no_copy_of_local_media(uri) -> None:
    loader = ll.Loader(uri, shuffle=True, clips=ll.video_clips(**SPEC))
    assert loader.source.cache is None and "byte range" in loader.source.cache_choice


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_corrupt_video_is_a_clip_error_naming_its_row(tmp_path, videos, where, request) -> None:
    """On an object store the row's columns are read on a fetch thread while the clips decode:
    the error still names the row's path."""
    broken = bytearray(videos[2])
    info = media_video.probe_video(videos[2])
    at = int(info.keyframe_offsets[1])
    broken[at : at + 400] = bytes(400)  # a GOP's packets zeroed, its index kept
    out = str(tmp_path / "broken.lance")
    table = video_table([videos[0], bytes(broken)])
    table = table.set_column(
        table.schema.get_field_index("video_frames"),
        "video_frames",
        pa.array([FRAMES[0], FRAMES[2]], pa.int64()),
    )
    options = {}
    if where == "local":
        lance.write_dataset(table, out, data_storage_version="2.2")
    else:
        s3 = request.getfixturevalue("s3")
        out, options = s3.write(table, data_storage_version="2.2"), s3.storage_options
    loader = ll.Loader(
        out,
        batch_size=2,
        clips=ll.video_clips(frames=4, stride=1, step=6),
        storage_options=options or None,
        cache=None,
    )
    assert loader.source.fetch_ahead == (where == "s3")
    with pytest.raises(
        ll.ClipError, match=r"frame 6 of Lance row 1 .*path=.v1.mp4.*filter="
    ) as raised:
        list(loader)
    assert isinstance(raised.value, ll.ReadError)
    del raised
    for _ in range(100):  # a failed read's fetch threads end too: those in flight by themselves
        if not lanceloader_threads():
            break
        time.sleep(0.1)
    assert lanceloader_threads() == []


def test_a_corrupt_video_is_a_clip_error_from_a_process_worker_too(tmp_path, videos) -> None:
    """A process worker's error crosses the pipe as its own type: ``except ll.ClipError``
    catches it as with thread workers (it used to arrive as a plain ReadError)."""
    broken = bytearray(videos[2])
    at = int(media_video.probe_video(videos[2]).keyframe_offsets[1])
    broken[at : at + 400] = bytes(400)
    table = video_table([videos[0], bytes(broken)])
    table = table.set_column(
        table.schema.get_field_index("video_frames"),
        "video_frames",
        pa.array([FRAMES[0], FRAMES[2]], pa.int64()),
    )
    out = str(tmp_path / "broken.lance")
    lance.write_dataset(table, out, data_storage_version="2.2")
    loader = ll.Loader(
        out,
        batch_size=2,
        clips=ll.video_clips(frames=4, stride=1, step=6),
        cache=None,
        num_workers=1,
        worker_type="process",
    )
    with pytest.raises(ll.ClipError, match=r"frame 6 of Lance row 1 .*path=.v1.mp4"):
        list(loader)


def test_bad_clip_settings_are_refused_by_name(uri) -> None:
    with pytest.raises(ValueError, match="frames must be an int >= 1"):
        ll.video_clips(frames=0)
    with pytest.raises(ValueError, match="step=2 and per_video=3"):
        ll.video_clips(step=2, per_video=3)
    with pytest.raises(TypeError, match="not a Lance blob column"):
        ll.Loader(uri, clips=ll.video_clips("path"))
    with pytest.raises(KeyError, match="'movie' is not in the dataset"):
        ll.Loader(uri, clips=ll.video_clips("movie"))
    with pytest.raises(ValueError, match=r"pack= and clips="):
        ll.Loader(uri, clips=ll.video_clips(), pack=ll.pack("video", 8))
    with pytest.raises(TypeError, match=r"must come from ll\.video_clips"):
        ll.Loader(uri, clips={"frames": 4})


def test_videos_of_several_sizes_need_a_size(tmp_path, videos) -> None:
    other = write_video(tmp_path / "big.mp4", 12, 12, (64, 96), gop=6).read_bytes()
    out = str(tmp_path / "sizes.lance")
    lance.write_dataset(video_table([videos[0], other]), out, data_storage_version="2.2")
    with pytest.raises(ValueError, match=r"2 frame sizes.*size=\(height, width\)"):
        ll.Loader(out, clips=ll.video_clips())
    loader = ll.Loader(out, batch_size=16, clips=ll.video_clips(frames=2, size=(32, 48)))
    assert next(iter(loader))["video"].shape[1:] == (2, 3, 32, 48)


# --- audio --------------------------------------------------------------------------------


def test_audio_clips_are_every_window_of_every_file(tmp_path) -> None:
    pytest.importorskip("lanceloader.media.audio")
    rate, seconds = 8000, [1.0, 0.55, 0.3]
    samples = [write_audio(tmp_path / f"a{i}.wav", s, rate, 2) for i, s in enumerate(seconds)]
    table = pa.table(
        {
            "name": [f"a{i}" for i in range(3)],
            "audio": lance.blob.blob_array(
                [(tmp_path / f"a{i}.wav").read_bytes() for i in range(3)]
            ),
        }
    )
    out = str(tmp_path / "audio.lance")
    shutil.rmtree(out, ignore_errors=True)
    lance.write_dataset(table, out, data_storage_version="2.2")
    loader = ll.Loader(out, batch_size=3, clips=ll.audio_clips(seconds=0.25, step=0.1))
    assert isinstance(loader.source, ClipSource)
    got = [
        (n, s, a)
        for b in loader
        for n, s, a in zip(list(b["name"]), b["clip_start"].tolist(), b["audio"], strict=True)
    ]
    want = [
        (f"a{i}", s)
        for i, sec in enumerate(seconds)
        for s in range(0, round(sec * rate) - 2000 + 1, 800)
    ]
    assert [(n, s) for n, s, _ in got] == want
    for name, start, window in got:
        expected = samples[int(name[1:])][start : start + 2000].T
        assert window.shape == (2, 2000)
        np.testing.assert_allclose(window, expected, atol=1 / 2**14)  # 16-bit PCM
    mono = ll.Loader(
        out, batch_size=2, clips=ll.audio_clips(seconds=0.25, sample_rate=4000, channels=1)
    )
    assert next(iter(mono))["audio"].shape == (2, 1, 1000)  # [N, C, T] at the asked rate


# --- media shorter than one clip ------------------------------------------------------------


def test_clips_longer_than_every_media_are_refused_naming_the_longest(uri, tmp_path) -> None:
    """A clip longer than every video (or window longer than every file) made an empty epoch
    with no word (len 0, 0 batches); now the construction says so, with the longest and the
    fix. Only some too short: one warning saying how many are left out."""
    with pytest.raises(ValueError, match=r"all 5 videos of column 'video' are shorter than one "
                       r"clip of video_clips\(frames=500, stride=1\).*every epoch would be empty; "
                       r"the longest, Lance row 2 \(.*'v2\.mp4'\), has 45 frames: pass "
                       r"video_clips\(\.\.\., frames=45\) or fewer"):  # fmt: skip
        ll.Loader(uri, batch_size=2, clips=ll.video_clips(frames=500))
    with pytest.raises(ValueError, match=r"frames=23\) or fewer \(or a smaller stride\)"):
        ll.Loader(uri, batch_size=2, clips=ll.video_clips(frames=30, stride=2))
    rate = 8000
    for i, seconds in enumerate([2.0, 3.0, 2.5]):
        write_audio(tmp_path / "sounds" / f"s{i}.wav", seconds, rate, 1)
    ll.convert(tmp_path / "sounds", tmp_path / "sounds.lance", progress=False)
    with pytest.raises(ValueError, match=r"all 3 audio files .* shorter than one window of "
                       r"audio_clips\(seconds=10\).*'s1\.wav'.*3\.000 s: pass "
                       r"audio_clips\(\.\.\., seconds=3\) or less"):  # fmt: skip
        ll.Loader(str(tmp_path / "sounds.lance"), clips=ll.audio_clips(seconds=10))


def test_media_too_short_for_a_clip_are_left_out_with_one_warning(uri, caplog) -> None:
    with caplog.at_level("WARNING", logger="lanceloader"):
        loader = ll.Loader(uri, batch_size=4, clips=ll.video_clips(frames=27))
    said = [r.getMessage() for r in caplog.records if "shorter than" in r.getMessage()]
    assert len(said) == 1, said
    assert "3 of the 5 videos of column 'video' are shorter than one clip" in said[0]
    assert "left out of every epoch; the shortest has 9 frames" in said[0]
    assert loader.source.short_media == 3 and loader.source.num_rows == 2  # 30 and 45 frames
    caplog.clear()
    with caplog.at_level("WARNING", logger="lanceloader"):
        ll.Loader(uri, batch_size=4, clips=ll.video_clips(frames=9))
    assert not [r for r in caplog.records if "shorter than" in r.getMessage()]


# --- variable frame rate through the Loader -------------------------------------------------


def test_variable_frame_rate_clips_equal_the_whole_file_decode(tmp_path) -> None:
    """A phone's or screen recorder's variable frame rate: every clip after the first GOP was
    a ClipError ("asked for bytes outside the clip's ranges 5 times"); each is now the whole
    file's frames, from the index convert writes and from one written before the keyframes'
    timestamps were (the column dropped)."""
    from mediagen import vfr_pts

    folder = tmp_path / "phone"
    for i, bframes in enumerate([0, 2]):
        write_video(folder / f"v{i}.mp4", 30, 30, SIZE, gop=8, bframes=bframes,
                    pts=vfr_pts(30, first=700 * i, seed=i))  # fmt: skip
    ll.convert(folder, tmp_path / "phone.lance", progress=False)
    whole = {f"v{i}.mp4": media_video.decode_whole(folder / f"v{i}.mp4", 0, 30) for i in range(2)}
    old = lance.dataset(str(tmp_path / "phone.lance"))
    for index in ("with keyframe_pts", "without"):
        if index == "without":
            old.drop_columns(["video_keyframe_pts"])
        loader = ll.Loader(str(tmp_path / "phone.lance"), batch_size=4, output="numpy",
                           clips=ll.video_clips(frames=3, step=1, layout="NFHWC"))  # fmt: skip
        index_columns = loader.source.index.table.column_names
        assert loader.source.index.origin == "columns"  # read, not probed again
        assert ("video_keyframe_pts" in index_columns) == (index == "with keyframe_pts")
        seen = 0
        for batch in loader:
            for path, start, clip in zip(batch["path"], batch["clip_start"], batch["video"],
                                         strict=True):  # fmt: skip
                assert np.array_equal(clip, whole[path][start : start + 3]), (index, path, start)
                seen += 1
        assert seen == 2 * 28
