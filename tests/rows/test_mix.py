"""Mix: the interleave is exact at every prefix, slices and resumes continue the uninterrupted
stream on any world size (weights changed or not), small sources repeat in fresh orders."""

from __future__ import annotations

import dataclasses
import itertools
import json
from fractions import Fraction

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import lanceloader as ll
from lanceloader.engine.tasks import stream_tasks
from lanceloader.ordering.interleave import Interleave, Runs, interleave, rational_weights
from lanceloader.ordering.interleave import locate as ll_locate
from lanceloader.rows.gather import gather_rows
from lanceloader.rows.placement import mixed_rows
from lanceloader.rows.protocol import as_table, read_table
from lanceloader.state.format import StateMismatchError


@settings(deadline=None)  # pure, but a loaded 2-core machine runs it past 200 ms
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=6).filter(any), st.sampled_from([1, 1, 2, 5])
)
def test_every_prefix_is_within_one_run_of_its_share(quotas: list[int], run: int) -> None:
    il = Interleave(tuple(quotas), run)
    period = il.period * run
    n = np.arange(3 * period + 1)
    total = np.zeros(len(n), np.int64)
    slots = interleave(tuple(quotas))
    for k, q in enumerate(quotas):
        counts = il.count(k, n)
        assert np.all(np.abs(counts - n * q / il.period) < run)
        assert np.all(np.diff(counts) == (il.source_of(n[:-1]) == k))  # one sample at a time
        assert np.all(il.source_of(n[:-1]).reshape(-1, run) == il.source_of(n[:-1:run])[:, None])
        for i in range(0, int(counts[-1]), 7):  # position_of inverts count
            at = il.position_of(k, i)
            assert il.source_of(np.array([at]))[0] == k and il.count(k, at) == i
        total += counts
    assert np.array_equal(total, n)
    assert np.array_equal(np.bincount(slots, minlength=len(quotas)), quotas)


@settings(deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=5))
def test_rational_weights_keep_the_proportions(weights: list[int]) -> None:
    quotas = rational_weights(weights)
    total = sum(weights)
    assert all(
        Fraction(q, sum(quotas)) == Fraction(w, total) for q, w in zip(quotas, weights, strict=True)
    )


def test_float_weights_become_their_obvious_fractions() -> None:
    assert rational_weights([0.7, 0.2, 0.1]) == [7, 2, 1]
    assert rational_weights([1 / 3, 2 / 3]) == [1, 2]
    assert sum(rational_weights([0.123456789, 0.2, 0.676543211])) <= 1 << 16


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    """Three datasets whose ids say where they come from: 1000 + row, 2000 + row, 3000 + row."""
    root = tmp_path_factory.mktemp("mix")
    out = {}
    for base, (name, rows) in enumerate([("a", 13), ("b", 40), ("c", 90)], start=1):
        table = pa.table(
            {
                "id": pa.array(np.arange(rows) + 1000 * base),
                "x": pa.array(np.arange(rows, dtype=np.float32)),
            }
        )
        out[name] = str(root / f"{name}.lance")
        lance.write_dataset(table, out[name], max_rows_per_file=16)
    return out


def _mix(sources, weights, epoch="first_exhausted", **kw) -> ll.Mix:
    return ll.Mix(
        {
            "a": ll.Loader(sources["a"], columns=["id"], shuffle=True, seed=3),
            "b": ll.Loader(
                sources["b"], columns=["id"], shuffle=True, shuffle_block_size=4, seed=4
            ),
            "c": ll.Loader(sources["c"], columns=["id"]),
        },
        weights=weights,
        samples_per_epoch=epoch,
        **kw,
    )


def _global(
    mix_factory, batch_size, world, start_state=None, batches=None, epochs=1, allow=()
) -> tuple[list[int], dict]:
    """The global stream of ``epochs`` epochs (or ``batches`` steps) read by ``world`` ranks in
    lock-step, and the state after."""
    loaders = [
        ll.Loader(mix_factory(), batch_size=batch_size, rank=r, world_size=world, num_workers=1)
        for r in range(world)
    ]
    if start_state is not None:
        for loader in loaders:
            loader.load_state_dict(start_state, allow_changes=allow)
    out: list[int] = []
    steps = 0
    for _ in range(epochs):
        its = [iter(loader) for loader in loaders]
        for group in zip(*its, strict=False):
            for batch in group:
                out.extend(batch["id"].tolist())
            steps += 1
            if batches is not None and steps == batches:
                state = loaders[0].state_dict()
                for loader in loaders:
                    loader.close()
                return out, state
        for it in its:  # equal batch counts: every rank ends together
            assert next(it, None) is None
    return out, loaders[0].state_dict()


def _sources_of(ids: list[int]) -> np.ndarray:
    return np.asarray(ids) // 1000 - 1


@settings(max_examples=15, deadline=None)
@given(
    w=st.lists(st.integers(0, 5), min_size=3, max_size=3).filter(any),
    epoch=st.sampled_from(["first_exhausted", "all_exhausted", 57]),
    batch=st.integers(1, 9),
    world_before=st.integers(1, 3),
    world_after=st.integers(1, 3),
    cut=st.integers(1, 12),
    run=st.sampled_from([1, 1, 3]),
)
def test_resume_anywhere_continues_the_stream(
    sources, w, epoch, batch, world_before, world_after, cut, run
) -> None:
    weights = dict(zip("abc", w, strict=True))
    factory = lambda: _mix(sources, weights, epoch, run_length=run)  # noqa: E731
    whole, _ = _global(factory, batch * world_before, 1, epochs=2)
    first, state = _global(factory, batch, world_before, batches=cut)
    assert len(json.dumps(state)) <= 2048
    n, step = factory().samples_per_epoch, batch * world_after
    # A last global batch smaller than the world is padded by wrapping around (as torch's
    # DistributedSampler does; tests/ordering/test_plan.py): compare streams without it.
    assume(all(r == 0 or r >= world_after for r in ((n - state["sample"]) % step, n % step)))
    r = n % (batch * world_before)
    assume(r == 0 or r >= world_before)
    rest, _ = _global(
        factory, batch, world_after, start_state=state, allow=("batch_size",), epochs=2
    )
    joined = first + rest
    # The first run may end its epoch early; the second finishes it and reads one more epoch.
    assert joined[: len(whole)] == whole[: len(joined)]
    # Proportions are exact at every prefix of the epoch, within ±1 per source (±1 run).
    mix = factory()
    src = _sources_of(whole[:n])
    for k, share in enumerate(mix.weights.values()):
        counts = np.cumsum(src == k)
        assert np.all(np.abs(counts - np.arange(1, n + 1) * share) < run)


def test_a_run_length_of_the_batch_size_gives_one_source_per_batch(sources, tmp_path) -> None:
    mix = _mix(sources, {"a": 1, "b": 2, "c": 3}, 300, run_length=8, source_column="source")
    batches = list(ll.Loader(mix, batch_size=8))
    assert len(batches) == 300 // 8 + 1 and all(
        len(set(b["source"].tolist())) == 1 for b in batches
    )
    src = np.array([b["source"][0] for b in batches[:-1]])
    assert np.bincount(src[:36], minlength=3).tolist() == [6, 12, 18]  # 1:2:3, counted in batches
    assert np.array_equal(
        _sources_of(np.concatenate([b["id"] for b in batches])),
        np.concatenate([b["source"] for b in batches]),
    )
    # "first_exhausted" in runs: the epoch ends as the first source gives its last row.
    first = _mix(sources, {"a": 1, "b": 1, "c": 1}, run_length=4)
    ids = np.concatenate([b["id"] for b in ll.Loader(first, batch_size=5)])
    assert len(ids) == len(set(ids.tolist())) and sum(ids // 1000 == 1) == 13
    # Runs of >= 64 rows are slices of each source's read, not a copy in mixed order; a batch
    # within a run is a view of its source's rows (two batches of one source share a buffer).
    for name in ("d", "e"):
        x = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(500 * 16, np.float32)), 16)
        lance.write_dataset(pa.table({"id": np.arange(500), "x": x}), tmp_path / f"{name}.lance")
    long = ll.Mix({n: str(tmp_path / f"{n}.lance") for n in "de"}, run_length=64)
    table = read_table(long.source(), np.arange(256))
    assert table["id"].num_chunks == 4 and table["id"].to_pylist() == (
        list(range(64)) + list(range(64)) + list(range(64, 128)) * 2
    )
    views = list(ll.Loader(long, batch_size=64, num_workers=1))  # reads of 2, 4, 8 batches
    address = [b["x"].__array_interface__["data"][0] for b in views]
    assert [b["id"][0] for b in views[2:6]] == [64, 64, 128, 128]  # d, e, d, e
    assert address[4] - address[2] == 64 * 16 * 4  # d's next rows in the same buffer
    ranks = [list(ll.Loader(long, batch_size=64, rank=r, world_size=2)) for r in range(2)]
    dealt = [i for pair in zip(*ranks, strict=True) for b in pair for i in b["id"].tolist()]
    assert dealt == np.concatenate([b["id"] for b in views]).tolist()  # two ranks, in turn
    arrow = list(ll.Loader(long, batch_size=48, output="arrow"))  # batches across two runs
    assert (
        np.concatenate([b["id"].to_numpy() for b in arrow]).tolist()
        == np.concatenate([b["id"] for b in views]).tolist()
    )
    short = ll.Mix({n: str(tmp_path / f"{n}.lance") for n in "de"}, run_length=8)
    copied = read_table(short.source(), np.arange(256))  # runs of 8 rows: copied into one chunk
    assert copied["id"].num_chunks == 1 and copied["id"].to_pylist()[:10] == [*range(8), 0, 1]
    with pytest.raises(ValueError, match="run_length"):
        _mix(sources, {"a": 1, "b": 1, "c": 1}, run_length=0)
    torch = pytest.importorskip("torch")
    tensors = list(ll.Loader(long, batch_size=64, output="torch"))  # slices, then tensors
    assert all(isinstance(b["x"], torch.Tensor) for b in tensors)
    assert (
        torch.cat([b["id"] for b in tensors]).tolist()
        == np.concatenate([b["id"] for b in views]).tolist()
    )


@settings(max_examples=40, deadline=None)
@given(
    w=st.lists(st.integers(0, 4), min_size=3, max_size=3).filter(any),
    run=st.integers(1, 5),
    offsets=st.lists(st.integers(0, 30), min_size=3, max_size=3),
    start=st.integers(0, 200),
    n=st.integers(1, 120),
    shuffled=st.booleans(),
)
def test_located_runs_are_the_stream_sample_by_sample(
    sources, w, run, offsets, start, n, shuffled
) -> None:
    """Reads of consecutive samples (located per slot) and any others (per sample) give each
    sample's source and its index in that source's stream, as the interleave's counts say."""
    mix = _mix(sources, dict(zip("abc", w, strict=True)), 57, run_length=run)
    run = mix.run  # each source's stream shifted, as a weight change at a resume leaves it
    mix = mix.with_run(
        dataclasses.replace(run, piece=dataclasses.replace(run.piece, base=tuple(offsets)))
    )
    stream = np.arange(start, start + n)  # may cross the end of a mix epoch (57 samples)
    if shuffled:
        stream = np.random.default_rng(start).permutation(stream)
    runs = mix.source().locate(stream)
    source = np.repeat(runs.source, runs.length)
    index = np.concatenate(
        [np.arange(i, i + k) for i, k in zip(runs.index, runs.length, strict=True)]
    )
    epoch, sample = np.divmod(stream, 57)
    assert source.tolist() == mix.interleave.source_of(sample).tolist()
    expected = [
        offsets[k] + e * mix.per_epoch[k] + int(mix.interleave.count(k, j))
        for k, e, j in zip(source.tolist(), epoch.tolist(), sample.tolist(), strict=True)
    ]
    assert index.tolist() == expected
    for k in range(3):  # and each source's indices, in stream order
        assert runs.indices(k).tolist() == [
            i for s, i in zip(source, expected, strict=True) if s == k
        ]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_mixed_rows_puts_every_row_in_its_place(data) -> None:
    """Copied (short runs, reordered parts) or handed out as pieces (long runs crossing the
    parts' record batches), the mixed rows are each source's next rows, in stream order."""
    sources = data.draw(st.integers(1, 3))
    runs = data.draw(
        st.lists(
            st.tuples(st.integers(0, sources - 1), st.integers(1, 150)), min_size=1, max_size=10
        )
    )
    parts, wheres, stream_rows = [], [], []
    for k in range(sources):
        n = sum(length for s, length in runs if s == k)
        cuts = sorted(data.draw(st.lists(st.integers(1, max(1, n - 1)), max_size=3)))
        edges = [0, *[c for c in cuts if 0 < c < n], n]
        values = np.arange(n) + 1000 * k
        batches = [
            pa.record_batch({"x": values[a:b]}) for a, b in itertools.pairwise(edges) if b > a
        ]
        parts.append(pa.Table.from_batches(batches, schema=pa.schema([("x", pa.int64())])))
        where = (
            np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n)))
            if n and data.draw(st.booleans())
            else None
        )
        wheres.append(where)
        stream_rows.append(list(values[where] if where is not None else values))
    source = np.array([s for s, _ in runs])
    length = np.array([length for _, length in runs])
    given = [0] * sources
    index, expected = [], []
    for s, n in runs:
        index.append(given[s])
        expected += stream_rows[s][given[s] : given[s] + n]
        given[s] += n
    out = mixed_rows(parts, wheres, Runs(source, np.array(index), length).merged())
    assert as_table(out)["x"].to_pylist() == expected


@settings(max_examples=80, deadline=None)
@given(
    quotas=st.lists(st.integers(0, 20), min_size=1, max_size=3).filter(any),
    first=st.integers(0, 500),
    n=st.integers(1, 300),
    data=st.data(),
)
def test_a_consecutive_read_sample_by_sample_is_placed_by_strides_as_by_index(
    quotas, first, n, data
) -> None:
    """A read of consecutive samples, one a run, locates each source's samples by the period's
    pattern (Slots) and copies its fixed-width columns by strides (sources of up to 16 slots;
    here also of up to 20, placed by index): every row lands where the per-sample placement
    puts it, in parts cut into record batches anywhere, a string column taken as before."""
    il = Interleave(tuple(quotas))
    epoch_samples = 10_000
    per_epoch = il.counts(epoch_samples)
    runs = ll_locate(il, epoch_samples, per_epoch, [0] * len(quotas), np.arange(first, first + n))
    assert runs.slots is not None
    plain = Runs(runs.source, runs.index, runs.length)  # the same runs, placed by index
    assert [p.tolist() for p in runs.places(len(quotas))] == [
        p.tolist() for p in plain.places(len(quotas))
    ]
    parts = []
    for k in range(len(quotas)):
        count = int(runs.spans[k][1])
        ids = np.arange(count) + 1000 * k
        whole = pa.table(
            {
                "id": ids,
                "v": pa.FixedSizeListArray.from_arrays(
                    pa.array(np.repeat(ids, 3).astype(np.float32)), 3
                ),
                "s": pa.array([f"{k}:{i}" for i in range(count)], pa.string()),
            }
        )
        cuts = sorted(data.draw(st.lists(st.integers(0, count), max_size=3)))
        parts.append(
            pa.Table.from_batches(
                [
                    b
                    for a, z in itertools.pairwise([0, *cuts, count])
                    for b in whole.slice(a, z - a).to_batches()
                ],
                schema=whole.schema,
            )
        )
    got = as_table(mixed_rows(parts, [None] * len(parts), runs))
    want = as_table(mixed_rows(parts, [None] * len(parts), plain))
    assert got.to_pylist() == want.to_pylist()
    source = il.source_of(np.arange(first, first + n))
    assert got["id"].to_numpy().tolist() == [
        1000 * k + int(i)
        for k, i in zip(source, runs.index - [runs.spans[k][0] for k in source], strict=True)
    ]


@pytest.fixture(scope="module")
def wide_sources(tmp_path_factory) -> dict[str, str]:
    """Three datasets of ids (1000 + row, ...), a fixed-size list and a string per row."""
    root = tmp_path_factory.mktemp("wide")
    out = {}
    for base, (name, rows) in enumerate([("a", 11), ("b", 37), ("c", 64)], start=1):
        ids = np.arange(rows) + 1000 * base
        table = pa.table(
            {
                "id": pa.array(ids),
                "v": pa.FixedSizeListArray.from_arrays(
                    pa.array(np.repeat(ids, 3).astype(np.float32)), 3
                ),
                "s": pa.array([f"r{i}" for i in ids.tolist()]),
            }
        )
        out[name] = str(root / f"{name}.lance")
        lance.write_dataset(table, out[name], max_rows_per_file=10)
    return out


@settings(max_examples=8, deadline=None)
@given(
    w=st.lists(st.integers(0, 4), min_size=3, max_size=3).filter(any),
    modes=st.lists(st.sampled_from(["sequential", "block", "full"]), min_size=3, max_size=3),
    run=st.sampled_from([1, 2, 70]),
    batch=st.integers(1, 40),
    per_read=st.integers(1, 5),
    epoch=st.integers(0, 2),
)
def test_a_mixed_epoch_is_each_sources_own_order_interleaved(
    wide_sources, w, modes, run, batch, per_read, epoch
) -> None:
    """Every column of every sample the loader delivers is the row the interleave and the
    source's own order name (computed here sample by sample, not through a read): copied into
    place or handed out as pieces, in reads of any size, in any epoch."""
    orders = {
        "sequential": {},
        "block": {"shuffle": True, "shuffle_block_size": 4},
        "full": {"shuffle": True},
    }
    own = {
        n: ll.Loader(wide_sources[n], seed=7 + k, **orders[modes[k]]) for k, n in enumerate("abc")
    }
    mix = ll.Mix(
        own, weights=dict(zip("abc", w, strict=True)), run_length=run, samples_per_epoch=150
    )
    loader = ll.Loader(mix, batch_size=batch, rows_per_read=batch * per_read, output="arrow")
    loader.set_epoch(epoch)
    got = pa.concat_tables(pa.Table.from_batches([b]) for b in loader)
    il, names = mix.interleave, mix.names
    expected = []
    for j in range(150):
        k = int(il.source_of(np.array([j]))[0])
        index = epoch * mix.per_epoch[k] + int(il.count(k, j))
        source = own[names[k]]
        e, sample = divmod(index, source.source.num_rows)
        row = int(source.order.positions(e, np.array([sample]))[0])
        expected.append(1000 * (k + 1) + row)
    assert got["id"].to_pylist() == expected
    assert got["v"].to_pylist() == [[float(i)] * 3 for i in expected]
    assert got["s"].to_pylist() == [f"r{i}" for i in expected]


# Column kinds gather_rows meets in a mix: scattered (fixed width, no nulls) or taken (the rest).
PLACED_KINDS = {
    "i64": (pa.int64(), lambda r, n: pa.array(r.integers(-9, 9, n))),
    "f16x3": (
        pa.list_(pa.float16(), 3),
        lambda r, n: pa.FixedSizeListArray.from_arrays(
            pa.array(r.standard_normal(3 * n).astype(np.float16)), 3
        ),
    ),
    "f32x4_null": (
        pa.list_(pa.float32(), 4),  # a null inside the values: taken
        lambda r, n: pa.FixedSizeListArray.from_arrays(
            pa.array([None if i == 1 else float(i) for i in range(4 * n)], pa.float32()), 4
        ),
    ),
    "bytes5": (
        pa.binary(5),
        lambda r, n: pa.array([bytes([i % 256] * 5) for i in range(n)], pa.binary(5)),
    ),
    "ts": (
        pa.timestamp("us", "UTC"),
        lambda r, n: pa.array(r.integers(0, 10**9, n), pa.timestamp("us", "UTC")),
    ),
    "text": (pa.string(), lambda r, n: pa.array([f"s{i}" * (i % 3) for i in range(n)])),
    "flag": (pa.bool_(), lambda r, n: pa.array(r.integers(0, 2, n).astype(bool))),
    "i32_null": (
        pa.int32(),
        lambda r, n: pa.array([None if i % 4 == 0 else i for i in range(n)], pa.int32()),
    ),
}


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_placed_rows_are_each_part_row_at_its_place_in_every_column_kind(data) -> None:
    """gather_rows (a mix's placement) against the rows placed one by one: every column kind, parts in chunks
    sliced out of larger arrays (offsets), rows reordered, repeated or in order."""
    kinds = data.draw(
        st.lists(st.sampled_from(sorted(PLACED_KINDS)), min_size=1, max_size=4, unique=True)
    )
    schema = pa.schema([(k, PLACED_KINDS[k][0]) for k in kinds])
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    sizes = data.draw(st.lists(st.integers(0, 40), min_size=1, max_size=4))
    parts, wheres, samples = [], [], []
    for size in sizes:
        pad = data.draw(st.integers(0, 3))  # the part's rows begin `pad` rows into its arrays
        whole = pa.table([PLACED_KINDS[k][1](rng, size + pad + 2) for k in kinds], schema=schema)
        part = whole.slice(pad, size)
        cuts = sorted(data.draw(st.lists(st.integers(0, size), max_size=2)))
        part = pa.Table.from_batches(
            [
                b
                for a, z in itertools.pairwise([0, *cuts, size])
                for b in part.slice(a, z - a).to_batches()
            ],
            schema=schema,
        )
        how = data.draw(st.sampled_from(["order", "permuted", "repeats"]))
        if how == "order" or size == 0:
            where, count = None, size
        elif how == "permuted":
            where, count = rng.permutation(size), size
        else:
            count = data.draw(st.integers(1, 2 * size))
            where = rng.integers(0, size, count)
        parts.append(part)
        wheres.append(where)
        samples.append(count)
    n = sum(samples)
    owner = rng.permutation(np.repeat(np.arange(len(sizes)), samples))  # each place's part
    places = [np.flatnonzero(owner == k) for k in range(len(sizes))]
    out = gather_rows(parts, wheres, places, n)
    assert out.schema.equals(schema) and out.num_rows == n
    expected: list[dict] = [{}] * n
    for k, (part, where, place) in enumerate(zip(parts, wheres, places, strict=True)):
        rows = part.to_pylist()
        for i, at in enumerate(place.tolist()):
            expected[at] = rows[i if where is None else int(where[i])]
        assert k < len(parts)
    assert out.to_pylist() == expected


@pytest.mark.parametrize(("weights", "run"), [((1, 1, 1), 1), ((3, 2, 1), 1), ((1, 2, 1), 4)])
def test_mixed_reads_fetch_whole_windows_of_every_block_shuffled_source(
    tmp_path, weights, run
) -> None:
    """A read cutting a source's window fetches part of each of its blocks, and the next read
    the rest: the loader's reads of a mix end where every source's window does."""
    names = "pqr"
    for name in names:
        lance.write_dataset(pa.table({"id": np.arange(6000)}), tmp_path / f"{name}.lance")
    mix = ll.Mix(
        {
            n: ll.Loader(
                str(tmp_path / f"{n}.lance"),
                shuffle=True,
                shuffle_block_size=8,
                shuffle_window=4,
                seed=i,
            )
            for i, n in enumerate(names)
        },
        weights=dict(zip(names, weights, strict=True)),
        run_length=run,
    )
    loader = ll.Loader(mix, batch_size=4, rows_per_read=512)
    source = loader.source
    plan = loader.plan(0)  # the tasks the engine runs: cut on the rows' hinted windows
    tasks = list(
        stream_tasks(loader.reading(1).work, 0, plan, loader.batches_per_read, range(len(plan)))
    )
    assert source.hints.window_rows == mix.window_samples and len(tasks) > 10
    for task in tasks[8:-1]:  # after the ramp, before the epoch's end
        runs = source.locate(task.samples)
        for k in range(3):
            index = runs.indices(k)
            assert index[0] % 32 == 0 and (index[-1] + 1) % 32 == 0  # whole windows of 32 rows


def record_source_reads(monkeypatch) -> list[tuple[str, int]]:
    """``(uri, rows)`` of every Lance read of the test, in order (Source.read_rows, spied)."""
    calls: list[tuple[str, int]] = []
    real = ll.rows.lance.source.Source.read_rows

    def recorded(self, positions, epoch=0):
        calls.append((self.uri, len(positions)))
        return real(self, positions, epoch)

    monkeypatch.setattr(ll.rows.lance.source.Source, "read_rows", recorded)
    return calls


@pytest.mark.parametrize(("weights", "parts"), [((1, 1, 1), 3), ((2, 1, 1), 2), ((5, 1, 0), 1)])
def test_each_source_reads_as_much_per_lance_call_as_on_its_own_loader(
    tmp_path, monkeypatch, weights, parts
) -> None:
    """A mix read is one read per source: sized like one source's read, a mix of 3 made 3
    Lance calls of a third of the rows (each call has a fixed cost, ~1.5x the CPU per row of
    264-byte rows). Sized by the sources (``read_parts``), each source's call is as large as
    on its own Loader, and never larger."""
    names = "pqr"
    for name in names:  # 8-byte rows: reads are 65,536 rows (the row cap, not the byte cap)
        lance.write_dataset(pa.table({"id": np.arange(160_000)}), tmp_path / f"{name}.lance")
    calls = record_source_reads(monkeypatch)
    own = ll.Loader(str(tmp_path / "p.lance"), batch_size=4096, num_workers=1)
    assert sum(len(b["id"]) for b in own) == 160_000
    own_read = max(n for _, n in calls)  # after the ramp of 1, 4, 16, ... batches
    assert own_read == 65_536
    calls.clear()
    mix = ll.Mix(
        {n: str(tmp_path / f"{n}.lance") for n in names},
        weights=dict(zip(names, weights, strict=True)),
        run_length=4096,
    )
    loader = ll.Loader(mix, batch_size=4096, num_workers=1)
    assert mix.source().hints.read_parts == parts
    ids = np.concatenate([b["id"] for b in loader])
    assert len(ids) == mix.samples_per_epoch  # every sample delivered once
    largest = max(n for _, n in calls)  # the largest share's source: within a run of its own
    assert own_read * max(weights) / sum(weights) * parts - 4096 <= largest <= own_read


def test_each_source_ramps_from_a_batch_as_on_its_own_loader(tmp_path, monkeypatch) -> None:
    """An epoch's first reads ramp up (1, 4, 16, ... batches); a mix read of one batch was 3
    Lance calls of a third of a batch each, at a call's fixed cost (~1 ms CPU). A mix ramps
    from ``read_parts`` batches: no source's call is under a batch, as on its own Loader."""
    for name in "pqr":
        lance.write_dataset(pa.table({"id": np.arange(3000)}), tmp_path / f"{name}.lance")
    reads = record_source_reads(monkeypatch)
    mix = ll.Mix({n: str(tmp_path / f"{n}.lance") for n in "pqr"})
    loader = ll.Loader(mix, batch_size=100, num_workers=1)
    ids = np.concatenate([b["id"] for b in loader])
    assert len(ids) == mix.samples_per_epoch == 9000
    calls = [n for _, n in reads]
    assert calls[:6] == [100] * 3 + [400] * 3  # reads of 3, then 12 batches
    assert min(calls) >= 100


@pytest.fixture(scope="module")
def tiny_uri(tmp_path_factory) -> str:
    uri = str(tmp_path_factory.mktemp("tiny") / "t.lance")
    lance.write_dataset(pa.table({"id": np.arange(8)}), uri)
    return uri


@settings(max_examples=30, deadline=None)
@given(w=st.lists(st.integers(0, 9), min_size=2, max_size=6).filter(lambda w: sum(w) > 0))
def test_read_parts_size_the_largest_share_as_one_sources_read(tiny_uri, w) -> None:
    """Reads of ``read_parts`` single reads give the largest source at most one read of its
    own (the engine's bound per Lance call), and one more part would give it more."""
    mix = ll.Mix({f"s{k}": tiny_uri for k in range(len(w))}, {f"s{k}": x for k, x in enumerate(w)})
    parts, share = mix.source().hints.read_parts, Fraction(max(w), sum(w))
    assert 1 <= parts <= 4 and parts * share <= 1
    assert parts == 4 or (parts + 1) * share > 1


def _keep(batch):  # a transform that keeps every row
    return batch


def test_with_a_transform_each_source_reads_as_much_per_call_as_on_its_own_loader(
    tmp_path, monkeypatch
) -> None:
    """A transform makes reads of a few batches (still in the CPU cache when transformed: 8 of
    these small rows, engine/sizing.py): in a mix of 3 that was 3 Lance calls of under a batch
    each, at 3.4x the CPU per row of one source."""
    for name in "pqr":
        lance.write_dataset(pa.table({"id": np.arange(20_000)}), tmp_path / f"{name}.lance")
    reads = record_source_reads(monkeypatch)
    own = ll.Loader(str(tmp_path / "p.lance"), batch_size=1024, transform=_keep, num_workers=1)
    assert sum(len(b["id"]) for b in own) == 20_000
    own_call = max(n for _, n in reads)
    assert own_call == own.batches_per_read * 1024 > 1024
    reads.clear()
    mix = ll.Mix({n: str(tmp_path / f"{n}.lance") for n in "pqr"}, run_length=1024)
    loader = ll.Loader(mix, batch_size=1024, transform=_keep, num_workers=1)
    assert sum(len(b["id"]) for b in loader) == mix.samples_per_epoch
    assert max(n for _, n in reads) == own_call


def test_oversampled_source_repeats_in_fresh_orders(sources) -> None:
    mix = _mix(sources, {"a": 1, "b": 1, "c": 1}, "all_exhausted")
    ids, _ = _global(lambda: mix, 10, 1)
    a = [i for i in ids if i // 1000 == 1]
    assert len(a) == mix.per_epoch[0] >= 13 * 6
    passes = [a[i : i + 13] for i in range(0, 13 * 6, 13)]
    assert all(sorted(p) == list(range(1000, 1013)) for p in passes)  # each pass: every row once
    assert len({tuple(p) for p in passes}) == len(passes)  # ... each in a new order
    c = [i for i in ids if i // 1000 == 3]
    assert c == list(range(3000, 3090))  # the largest source is read once, in its own order


def test_sources_continue_across_mix_epochs(sources) -> None:
    mix = _mix(sources, {"a": 1, "b": 1, "c": 1})  # ends when 'a' (13 rows) is used up
    ids, _ = _global(lambda: mix, 8, 1, epochs=7)
    c = [i for i in ids if i // 1000 == 3]
    assert c[:90] == list(range(3000, 3090))  # 'c' is not restarted each mix epoch
    assert len(c) == 7 * mix.per_epoch[2]


@settings(max_examples=10, deadline=None)
@given(
    old=st.lists(st.integers(1, 4), min_size=3, max_size=3),
    new=st.lists(st.integers(0, 4), min_size=3, max_size=3).filter(any),
    cut=st.integers(1, 10),
    world=st.integers(1, 2),
)
def test_changed_weights_continue_every_source_where_it_stood(
    sources, old, new, cut, world
) -> None:
    before = lambda: _mix(sources, dict(zip("abc", old, strict=True)), "all_exhausted")  # noqa: E731
    after = lambda: _mix(sources, dict(zip("abc", new, strict=True)), "all_exhausted")  # noqa: E731
    first, state = _global(before, 4, world, batches=cut)
    if rational_weights(old) != rational_weights(new):  # the same shares are no change
        with pytest.raises(StateMismatchError, match="allow_changes=\\('weights',\\)"):
            ll.Loader(after(), batch_size=4).load_state_dict(state)
    rest, end = _global(after, 4, 1, start_state=state, allow=("weights",), epochs=2)
    # Each source's rows, before and after, are a prefix of that source's own endless stream.
    for k, name in enumerate("abc"):
        alone = _mix(sources, {n: int(n == name) for n in "abc"}, 3000)
        own, _ = _global(lambda alone=alone: alone, 500, 1)
        got = [i for i in first + rest if i // 1000 == k + 1]
        assert got == own[: len(got)]
    # And the resumed run resumes again from its own state (the offsets travel with it).
    again, _ = _global(after, 4, 1, start_state=end, epochs=1)
    assert len(again) == after().samples_per_epoch


def test_process_workers_deliver_the_thread_stream(sources) -> None:
    mix = lambda: _mix(sources, {"a": 2, "b": 3, "c": 5}, source_column="source")  # noqa: E731
    threads = [b for b in ll.Loader(mix(), batch_size=16, num_workers=2)]
    procs = [b for b in ll.Loader(mix(), batch_size=16, num_workers=2, worker_type="process")]
    assert [b["id"].tolist() for b in threads] == [b["id"].tolist() for b in procs]
    assert [b["source"].tolist() for b in threads] == [b["source"].tolist() for b in procs]
    assert np.array_equal(
        np.concatenate([b["source"] for b in threads]),
        _sources_of(np.concatenate([b["id"] for b in threads]).tolist()),
    )


def test_a_source_transform_conforms_columns(sources, tmp_path) -> None:
    other = str(tmp_path / "renamed.lance")
    lance.write_dataset(pa.table({"ident": pa.array(np.arange(5) + 9000, pa.int32())}), other)
    with pytest.raises(ValueError, match="different columns"):
        ll.Mix({"a": ll.Loader(sources["a"], columns=["id"]), "o": ll.Loader(other)})

    def rename(batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.record_batch({"id": batch.column("ident")})

    mix = ll.Mix(
        {"a": ll.Loader(sources["a"], columns=["id"]), "o": ll.Loader(other, transform=rename)},
        samples_per_epoch=10,
    )
    ids = np.concatenate([b["id"] for b in ll.Loader(mix, batch_size=4)]).tolist()
    assert sorted(i for i in ids if i >= 9000) == list(range(9000, 9005))  # int32 cast to int64

    # The first source's transform sets the common schema (the others conform to it).
    first = ll.Mix(
        {"o": ll.Loader(other, transform=rename), "a": ll.Loader(sources["a"], columns=["id"])},
        samples_per_epoch=10,
    )
    assert first.schema.names == ["id"] and first.schema.field("id").type == pa.int32()
    ids = np.concatenate([b["id"] for b in ll.Loader(first, batch_size=4)]).tolist()
    assert sorted(i for i in ids if i >= 9000) == list(range(9000, 9005))

    def drop_half(batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.record_batch({"id": batch.column("ident")}).slice(0, 1)

    bad = ll.Mix(
        {"a": ll.Loader(sources["a"], columns=["id"]), "o": ll.Loader(other, transform=drop_half)},
        samples_per_epoch=10,
    )
    with pytest.raises(ll.TransformOutputError, match="mix source 'o'"):
        list(ll.Loader(bad, batch_size=4))


def test_weights_by_tokens(tmp_path) -> None:
    uris = {}
    for name, length in (("short", 10), ("long", 40)):
        uris[name] = str(tmp_path / f"{name}.lance")
        tokens = pa.array([[1] * length] * 200, pa.list_(pa.int32()))
        lance.write_dataset(pa.table({"input_ids": tokens}), uris[name])
    mix = ll.Mix(
        uris, weights={"short": 1, "long": 1}, weights_by="tokens", token_column="input_ids"
    )
    assert mix.weights == {"short": 0.8, "long": 0.2}  # equal tokens: 4 short rows per long one


def test_bad_mixes_are_named(sources) -> None:
    with pytest.raises(ValueError, match="one weight per source"):
        ll.Mix({"a": sources["a"]}, weights={"b": 1})
    with pytest.raises(ValueError, match="not all be 0"):
        ll.Mix({"a": sources["a"]}, weights={"a": 0})
    with pytest.raises(ValueError, match="token_column"):
        ll.Mix({"a": sources["a"]}, weights_by="tokens")
    with pytest.raises(ValueError, match="samples_per_epoch"):
        ll.Mix({"a": sources["a"]}, samples_per_epoch=0)
    with pytest.raises(ValueError, match=r"set them on the source"):
        ll.Loader(ll.Mix({"a": sources["a"]}), batch_size=4, shuffle=True)
    with pytest.raises(ValueError, match="filter"):
        ll.Loader(ll.Mix({"a": sources["a"]}), batch_size=4, filter="id > 3")


def test_refused_nestings_say_why(sources) -> None:
    inner = ll.Loader(ll.Mix({"a": sources["a"], "b": sources["b"]}), batch_size=4)
    with pytest.raises(TypeError, match="a mix of mixes is one mix"):
        ll.Mix({"m": inner, "c": sources["c"]})
    skipping = ll.Loader(sources["a"], transform=ll.map_rows(dict), on_error="skip")
    with pytest.raises(ValueError, match=r"on_error='skip'.* on the mix's Loader"):
        ll.Mix({"a": skipping, "c": sources["c"]})
    with pytest.raises(ValueError, match="pack"):
        ll.Loader(ll.Mix({"a": sources["a"]}), batch_size=4, pack=ll.pack("id", 8))


def test_weights_are_checked_whatever_their_form(sources) -> None:
    """A weight too small to get a slot was silently 0; NumPy ints refused while floats
    passed; inf overflowed; a list gave a dict-update TypeError."""
    two = {"a": sources["a"], "b": sources["b"]}
    with pytest.raises(ValueError, match=r"'a' \(1e-06\) is below 1/65536"):
        ll.Mix(two, weights={"a": 1e-6, "b": 1})
    mix = ll.Mix(two, weights={"a": np.int64(1), "b": np.float64(3)})
    assert mix.weights == {"a": 0.25, "b": 0.75}
    with pytest.raises(ValueError, match="finite number >= 0, got inf"):
        ll.Mix(two, weights={"a": float("inf"), "b": 1})
    with pytest.raises(TypeError, match=r"weights must be a dict .* got the list \[1, 2\]"):
        ll.Mix(two, weights=[1, 2])


def test_a_random_map_in_a_source_draws_per_sample_and_epoch(sources) -> None:
    """A source's random_map draws what the same source's own Loader draws: per (source epoch,
    sample), anew each epoch (it drew 1,426 distinct values for 6,001 rows, the same each epoch).
    """

    def draw(row, rng):
        return {"id": row["id"], "draw": int(rng.integers(1 << 62))}

    def source(name, **kw):
        return ll.Loader(sources[name], columns=["id"], transform=ll.random_map(draw), **kw)

    mix = ll.Mix(
        {"a": source("a", shuffle=True, seed=3), "c": source("c", seed=5)},
        weights={"a": 1, "c": 1},
        samples_per_epoch=60,
    )
    loader = ll.Loader(mix, batch_size=7, num_workers=2)
    rows = [
        (i, d)
        for _ in range(2)
        for b in loader
        for i, d in zip(b["id"].tolist(), b["draw"].tolist(), strict=True)
    ]
    for name, seed, shuffle in (("a", 3, True), ("c", 5, False)):
        own = source(name, shuffle=shuffle, seed=seed, batch_size=5)
        mine = [r for r in rows if r[0] // 1000 == " abc".index(name)]
        alone = [
            (i, d)
            for _ in range(10)
            for b in own
            for i, d in zip(b["id"].tolist(), b["draw"].tolist(), strict=True)
        ]
        assert mine == alone[: len(mine)]  # the source's stream, drawn as on its own
    draws = [d for _, d in rows]
    assert len(set(draws)) == len(draws)  # 120 samples, 9 epochs of 'a': never a repeat


def test_a_refused_state_changes_nothing_and_order_of_sources_does_not_matter(sources) -> None:
    """A state refused for its batch_size had already shifted the sources' offsets; sources
    listed in another order were refused as a moved dataset."""

    def mix(weights, names="ab"):
        return ll.Mix(
            {n: ll.Loader(sources[n], columns=["id"], shuffle=True, seed=1) for n in names},
            weights=weights,
            samples_per_epoch=40,
        )

    saved = ll.Loader(mix({"a": 1, "b": 2}), batch_size=4)
    it = iter(saved)
    for _ in range(5):
        next(it)
    state = saved.state_dict()
    fresh = ll.Loader(mix({"a": 1, "b": 1}), batch_size=40)
    before = [b["id"].tolist() for b in ll.Loader(mix({"a": 1, "b": 1}), batch_size=40)]
    with pytest.raises(StateMismatchError, match="batch_size"):
        fresh.load_state_dict(state, allow_changes=("weights",))
    assert [b["id"].tolist() for b in fresh] == before
    swapped = ll.Loader(mix({"b": 2, "a": 1}, names="ba"), batch_size=4)
    swapped.load_state_dict(state)
    rest = [b["id"].tolist() for b in it]
    assert [b["id"].tolist() for b in swapped] == rest


def test_malformed_mix_sections_are_named(sources) -> None:
    from lanceloader.state.format import fingerprint

    loader = ll.Loader(_mix(sources, {"a": 1, "b": 1, "c": 1}), batch_size=4)
    for damage in (
        lambda m: m.pop("quotas"),
        lambda m: m["quotas"].update(a="1"),
        lambda m: m.__setitem__("sources", []),
        lambda m: m["anchor"]["piece"]["base"].pop("b"),
        lambda m: m["anchor"].pop("index"),
        lambda m: m.__setitem__("schedule", {}),
        lambda m: m["sources"]["a"].pop("order"),
    ):
        state = json.loads(json.dumps(loader.state_dict()))
        damage(state["order"]["mix"])
        state["fingerprint"] = fingerprint(state["dataset"], state["version"], state["order"])
        with pytest.raises(StateMismatchError, match=r"state\['order'\]\['mix'\]"):
            ll.Loader(_mix(sources, {"a": 1, "b": 1, "c": 1}), batch_size=4).load_state_dict(state)


def test_a_mix_of_packed_sources_reports_its_padding(tmp_path) -> None:
    for name, lengths in (("p", [3, 5, 2, 6, 7, 1]), ("q", [4, 4, 4, 9])):
        tokens = [list(range(n)) for n in lengths * 5]
        lance.write_dataset(pa.table({"tokens": tokens}), tmp_path / f"{name}.lance")
    packed = {n: ll.Loader(tmp_path / f"{n}.lance", pack=ll.pack("tokens", 8)) for n in "pq"}
    loader = ll.Loader(ll.Mix(packed, weights={"p": 1, "q": 1}), batch_size=4)
    for _ in loader:
        pass
    stats = loader.stats()
    pads = [p.packing.padding_fraction for p in packed.values()]
    counts = loader.source.mix.per_epoch  # packed rows of each source in an epoch (one length)
    assert stats.padding_fraction == pytest.approx(
        sum(p * c for p, c in zip(pads, counts, strict=True)) / sum(counts)
    )
    assert "padding" in str(stats)


def test_torch_iterable_dataset_over_a_mix(sources) -> None:
    torch = pytest.importorskip("torch")
    from lanceloader.torch import IterableDataset

    mix = _mix(sources, {"a": 1, "b": 1, "c": 2})
    expected, _ = _global(lambda: mix, 8, 1)
    ds = IterableDataset(mix, batch_size=8)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    got = [int(i) for batch in loader for i in batch["id"]]
    assert sorted(got) == sorted(expected)  # DataLoader workers interleave whole batches
    with pytest.raises(ValueError, match="each source's Loader"):
        ll.Loader(mix, batch_size=8).mixing_report()


def test_a_mix_of_lance_rows_in_order_gets_the_thread_workers_a_single_source_gets(sources):
    """A mix whose every read is Lance range reads (sources in order, no cache, no transform)
    waits on Lance's threads as one source does, so its default is two thread workers per
    core, as a single source's: with one per core a default mix sample by sample ran at 0.58x
    a default single source, with two 0.66x (one source per batch 0.81x, 0.87x; 2 cores)."""
    from lanceloader.pipeline import usable_cores

    cores = usable_cores()
    plain = {name: ll.Loader(uri, cache=None) for name, uri in sources.items()}
    single = ll.Loader(next(iter(sources.values())), cache=None)
    assert ll.Loader(ll.Mix(plain)).num_workers == single.num_workers == 2 * cores
    one_shuffled = dict(plain, a=ll.Loader(sources["a"], cache=None, shuffle=True))
    one_transformed = dict(
        plain, a=ll.Loader(sources["a"], cache=None, transform=lambda batch: batch)
    )
    one_cached = dict(plain, a=ll.Loader(sources["a"], cache="memory"))
    for mix in (one_shuffled, one_transformed, one_cached):
        assert ll.Loader(ll.Mix(mix)).num_workers == cores  # reads that hold a core
    assert ll.Loader(ll.Mix(plain), worker_type="process").num_workers == cores
