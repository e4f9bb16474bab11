"""Lance blob columns (``lance.blob.blob_field``): read as bytes by every output, nulls kept,
read as files or descriptors only by request, sized by their payloads, cached, converted and
materialised as blobs; locally and on the real S3 server of ``tests/s3server.py``."""

from __future__ import annotations

import io
import itertools

import lance
import lance.blob
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import lanceloader as ll
from lanceloader.cli.inspect import inspect_lines
from lanceloader.engine.sizing import READ_BYTES_MOST
from lanceloader.rows.lance.blob_files import blob_locations, sidecar_name
from lanceloader.rows.lance.blobs import blob_columns, blob_files, is_blob_field, read_blob_payloads
from lanceloader.rows.lance.inline_blobs import (
    CHECKED_VERSIONS,
    MAX_GAP,
    FragmentFiles,
    fragment_files,
    inline_runs,
    read_inline,
)
from lanceloader.rows.lance.source import Source
from lanceloader.rows.protocol import StorageIO

ROWS = 40
NULL_EVERY = 7  # rows i with i % 7 == 3 hold a null blob


def jpeg(i: int, side: int = 16) -> bytes:
    """A real JPEG whose pixels depend on ``i``."""
    out = io.BytesIO()
    Image.new("RGB", (side, side), (i * 37 % 256, i * 11 % 256, 255 - i % 256)).save(out, "JPEG")
    return out.getvalue()


def payloads(rows: int = ROWS, nulls: bool = True) -> list[bytes | None]:
    return [None if nulls and i % NULL_EVERY == 3 else jpeg(i) for i in range(rows)]


def blob_table(values: list[bytes | None]) -> pa.Table:
    return pa.table(
        {"id": pa.array(range(len(values)), pa.int64()), "image": lance.blob.blob_array(values)}
    )


def flat(batches) -> list[bytes | None]:
    """The blob column of arrow batches, in order."""
    return [value for batch in batches for value in batch.column("image").to_pylist()]


def as_bytes(column) -> list[bytes | None]:
    """A delivered column (Arrow array, list, ByteRows, tensor list) as a list of bytes."""
    if isinstance(column, pa.Array | pa.ChunkedArray):
        return column.to_pylist()
    return [None if v is None else bytes(v) for v in column]


@pytest.fixture(scope="module")
def images() -> list[bytes | None]:
    return payloads()


@pytest.fixture(scope="module")
def blob_uri(tmp_path_factory: pytest.TempPathFactory, images) -> str:
    """ROWS rows of JPEG blobs (some null) in 3 fragments."""
    uri = str(tmp_path_factory.mktemp("blobs") / "images.lance")
    lance.write_dataset(blob_table(images), uri, max_rows_per_file=16)
    return uri


@pytest.fixture(scope="module")
def full_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """ROWS rows of JPEG blobs, none null."""
    uri = str(tmp_path_factory.mktemp("blobs") / "full.lance")
    lance.write_dataset(blob_table(payloads(nulls=False)), uri, max_rows_per_file=16)
    return uri


def test_blob_columns_are_found_in_the_dataset_schema(blob_uri: str) -> None:
    schema = lance.dataset(blob_uri).schema
    assert blob_columns(schema) == ["image"]
    assert not is_blob_field(schema.field("id"))


@pytest.mark.parametrize("output", ["arrow", "python", "numpy", "torch"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_output_delivers_the_payloads_written(
    blob_uri: str, images, output: str, shuffle: bool
) -> None:
    """Today: descriptors ({'kind', 'position', ...}) for arrow/python, a refusal for numpy."""
    fill = {"image": b""} if output in ("numpy", "torch") else None
    conversion = ll.Conversion(output="torch") if output == "torch" else output
    loader = ll.Loader(
        blob_uri,
        batch_size=8,
        output=conversion,
        fill_nulls=fill,
        shuffle=shuffle,
        seed=1,
        num_workers=2,
    )
    got: dict[int, bytes | None] = {}
    for batch in loader:
        ids = batch.column("id").to_pylist() if output == "arrow" else list(batch["id"])
        column = batch.column("image") if output == "arrow" else batch["image"]
        got.update(zip((int(i) for i in ids), as_bytes(column), strict=True))
    want = {i: (b"" if fill and v is None else v) for i, v in enumerate(images)}
    assert got == want


@pytest.fixture(scope="module")
def deleted_uri(tmp_path_factory: pytest.TempPathFactory, images) -> str:
    """The JPEG blobs in fragments of 8, with every row whose id % 5 == 1 deleted: row offsets
    are no longer ids."""
    uri = str(tmp_path_factory.mktemp("blobs") / "deleted.lance")
    lance.write_dataset(blob_table(images), uri, max_rows_per_file=8).delete("id % 5 = 1")
    return uri


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 31), max_size=40), st.sampled_from([None, "id % 3 = 0"]))
def test_any_positions_read_their_own_payloads(deleted_uri: str, images, positions, filter) -> None:
    """Any order, duplicates, deletions and a filter: each row's payload is its own."""
    source = _sources.setdefault((deleted_uri, filter), Source(deleted_uri, filter=filter))
    positions = [p % source.num_rows for p in positions]
    rows = source.read(np.array(positions, dtype=np.int64))
    ids = rows.column("id").to_pylist()
    assert rows.column("image").to_pylist() == [images[i] for i in ids]
    assert len(ids) == len(positions)


_sources: dict[tuple[str, str | None], Source] = {}


def test_process_workers_deliver_the_same_payloads(blob_uri: str, images) -> None:
    """Each worker process reopens the dataset and reads the payloads itself."""
    loader = ll.Loader(
        blob_uri,
        batch_size=8,
        output="arrow",
        worker_type="process",
        num_workers=2,
        shuffle=True,
        seed=4,
    )
    threads = ll.Loader(blob_uri, batch_size=8, output="arrow", shuffle=True, seed=4)
    assert flat(loader) == flat(threads)
    assert sorted(flat(loader), key=lambda v: v or b"") == sorted(images, key=lambda v: v or b"")


def test_decode_images_works_on_a_blob_column(full_uri: str) -> None:
    loader = ll.Loader(
        full_uri, batch_size=8, transform=ll.decode_images("image"), output="numpy", num_workers=1
    )
    batch = next(iter(loader))
    expected = np.stack([np.asarray(Image.open(io.BytesIO(jpeg(i)))) for i in range(8)])
    assert np.array_equal(batch["image"], expected)


def test_null_blobs_stay_null_and_a_tensor_output_names_them(blob_uri: str, images) -> None:
    rows = Source(blob_uri).read(np.array([3, 10, 4, 3]))
    assert rows.column("image").to_pylist() == [None, None, images[4], None]
    loader = ll.Loader(blob_uri, batch_size=ROWS, output="numpy")
    with pytest.raises(ll.ConversionError, match=r"'image'.*fill_nulls"):
        next(iter(loader))


def test_descriptors_only_by_request(blob_uri: str) -> None:
    rows = Source(blob_uri, blobs={"image": "descriptor"}).read(np.array([4, 3]))
    first, null = rows.column("image").to_pylist()
    assert null is None and set(first) >= {"position", "size"}
    assert first["size"] == len(jpeg(4))
    assert Source(blob_uri, blobs={"image": "descriptor"}).schema_table().schema == rows.schema


@pytest.mark.parametrize(
    ("blobs", "problem"),
    [
        (
            {"image": "stream"},
            r"'stream' is not a way to read blob column 'image'; choose one of "
            r"'bytes'.*'file'.*'descriptor'",
        ),
        (
            {"id": "file"},
            r"column 'id' is not a blob column of the dataset; the blob columns read "
            r"are \['image'\]",
        ),
        ({"nope": "bytes"}, r"column 'nope' is not a blob column"),
    ],
)
def test_a_wrong_choice_or_column_is_named_with_the_choices(blob_uri: str, blobs, problem) -> None:
    with pytest.raises(ValueError, match=problem):
        Source(blob_uri, blobs=blobs)


def test_files_read_the_payloads_and_nulls_are_none(blob_uri: str, images) -> None:
    source = Source(blob_uri, blobs={"image": "file"})
    batch = source.read(np.array([5, 3, 18]))
    assert batch.schema.field("image").type == pa.int64()
    files = blob_files(batch, "image", rows=source)
    assert files[1] is None
    assert files[0].read() == images[5]
    files[2].seek(10)
    assert files[2].read(20) == images[18][10:30]
    with pytest.raises(ValueError, match=r"blobs=\{'image': 'file'\}"):
        blob_files(Source(blob_uri).read(np.array([0])), "image", rows=source)
    with pytest.raises(ValueError, match=r"outside a Loader's transform.*rows=source"):
        blob_files(batch, "image")  # which rows? a batch names none, and no registry guesses


def test_bytes_per_row_counts_payloads_so_reads_stay_within_the_bound(tmp_path) -> None:
    """Today a 200 KB row counts as its ~40-byte descriptor: one read of 65,536 rows (13 GB)."""
    uri = str(tmp_path / "big.lance")
    rng = np.random.default_rng(0)
    big = [rng.integers(0, 256, 200_000, dtype=np.uint8).tobytes() for _ in range(48)]
    lance.write_dataset(blob_table(big), uri)
    source = Source(uri)
    assert 200_000 <= source.bytes_per_row < 201_000
    loader = ll.Loader(uri, batch_size=4, output="arrow")
    rows_per_read = loader._pipeline.batches_per_read * 4
    assert rows_per_read * 200_000 <= READ_BYTES_MOST
    assert rows_per_read >= READ_BYTES_MOST // 200_000 - 4  # still big reads: not one at a time
    assert as_bytes(next(iter(loader)).column("image")) == big[:4]


def test_a_cache_directory_holds_payloads(blob_uri: str, images, tmp_path) -> None:
    """Pieces hold the payloads: a second read comes from the cache, bytes and nulls alike."""
    source = Source(blob_uri, cache=str(tmp_path / "cache"))
    everything = np.arange(ROWS)[::-1]
    first = source.read_rows(everything)
    second = source.read_rows(everything)
    want = images[::-1]
    assert first.rows.column("image").to_pylist() == want
    assert second.rows.column("image").to_pylist() == want
    assert second.rows_cached == ROWS and second.io_bytes == 0


def test_same_rows_on_s3_with_few_gets_and_a_cache_makes_none(s3, images, tmp_path) -> None:
    """Payloads come with a planned read_blobs: a handful of GETs per read, not one per row;
    a cache directory serves the second epoch with no request."""
    remote = s3.write(blob_table(images), max_rows_per_file=16)
    options = s3.storage_options
    loader = ll.Loader(remote, batch_size=ROWS, output="arrow", storage_options=options)
    s3.requests(reset=True)
    batch = next(iter(loader))
    gets = s3.requests().get("GET", 0)
    assert batch.column("image").to_pylist() == images
    assert gets <= 12, gets  # 3 fragments: descriptors + payloads, a few ranges each
    # an object store's payloads come through read_blobs, never local preads
    assert fragment_files(lance.dataset(remote, storage_options=options), "image") is None
    cached = ll.Loader(
        remote, batch_size=8, output="arrow", storage_options=options, cache=str(tmp_path / "cache")
    )
    assert flat(cached) == images
    s3.requests(reset=True)
    assert flat(cached) == images
    assert s3.requests().get("GET", 0) == 0


def test_files_on_s3_read_only_the_ranges_asked_for(s3) -> None:
    """A 4 MB blob read through a file for 1 KB: Lance reads about that, in few GETs."""
    rng = np.random.default_rng(1)
    big = [rng.integers(0, 256, 4_000_000, dtype=np.uint8).tobytes() for _ in range(3)]
    remote = s3.write(blob_table(big))
    source = Source(remote, storage_options=s3.storage_options, blobs={"image": "file"})
    batch = source.read(np.array([2, 0]))
    s3.requests(reset=True)
    source.dataset.io_stats_incremental()
    files = blob_files(batch, "image", buffer_size=4096, rows=source)
    files[0].seek(1_000_000)
    assert files[0].read(1000) == big[2][1_000_000:1_001_000]
    read = source.dataset.io_stats_incremental().read_bytes
    gets = s3.requests().get("GET", 0)
    assert read < 100_000, read
    assert gets <= 4, gets


def test_convert_writes_blob_columns_and_the_loader_reads_them_back(tmp_path, images) -> None:
    table = pa.table({"id": pa.array(range(ROWS)), "image": pa.array(images, pa.binary())})
    out = str(tmp_path / "out.lance")
    ll.convert(table, out, blob_columns=["image"])
    assert blob_columns(lance.dataset(out).schema) == ["image"]
    assert flat(ll.Loader(out, batch_size=16, output="arrow")) == images
    with pytest.raises(ValueError, match="'id', which is int64"):
        ll.convert(table, str(tmp_path / "bad.lance"), blob_columns=["id"])


def test_materialize_keeps_blob_columns(blob_uri: str, images, tmp_path) -> None:
    out = str(tmp_path / "copy.lance")
    loader = ll.Loader(blob_uri, batch_size=8, shuffle=True, seed=2, output="arrow")
    ll.materialize(loader, out)
    copy = lance.dataset(out)
    assert blob_columns(copy.schema) == ["image"]
    rows = copy.to_table(columns=["id"]).column("id").to_pylist()
    payload = [b for _, b in copy.read_blobs("image", indices=list(range(ROWS)))]
    assert payload == [images[i] for i in rows]


def test_inspect_shows_blob_payload_bytes(blob_uri: str, images) -> None:
    line = next(li for li in inspect_lines(blob_uri) if li.split()[:2] == ["image", "blob"])
    sizes = [len(v) for v in images if v is not None]
    assert f"mean {ll_format(sum(sizes) / len(sizes))}" in line


def ll_format(n: float) -> str:
    from lanceloader.units import format_bytes

    return format_bytes(n)


def read_heads(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A transform that reads 4 bytes of each blob at offset 2 through its file."""
    heads = []
    for f in blob_files(batch, "image"):
        if f is None:
            heads.append(None)
            continue
        with f:
            f.seek(2)
            heads.append(f.read(4))
    return pa.record_batch({"id": batch.column("id"), "head": pa.array(heads, pa.binary())})


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_a_loader_hands_a_transform_files_of_its_blobs(blob_uri: str, images, worker_type) -> None:
    """Loader(blobs={column: "file"}): a transform reads only what it asks for, in thread and
    process workers, in a shuffled order."""
    loader = ll.Loader(
        blob_uri,
        batch_size=8,
        shuffle=True,
        blobs={"image": "file"},
        transform=read_heads,
        output="arrow",
        num_workers=2,
        worker_type=worker_type,
    )
    got = {
        i: h
        for b in loader
        for i, h in zip(b["id"].to_pylist(), b["head"].to_pylist(), strict=True)
    }
    assert got == {i: None if v is None else v[2:6] for i, v in enumerate(images)}


def test_a_transform_opens_blob_files_with_the_loaders_storage_options(s3) -> None:
    """A transform in a process worker opens the files on the rows its batch came from, with
    their storage options (the S3 endpoint and keys here): the old registry, empty in a
    process worker, opened the dataset by URI alone, which fails on any store that needs
    options."""
    values = [bytes([i]) * 3000 for i in range(12)]
    remote = s3.write(blob_table(values))
    loader = ll.Loader(
        remote,
        storage_options=s3.storage_options,
        batch_size=4,
        cache=None,
        blobs={"image": "file"},
        transform=read_heads,
        output="arrow",
        num_workers=1,
        worker_type="process",
    )
    got = {
        i: h
        for b in loader
        for i, h in zip(b["id"].to_pylist(), b["head"].to_pylist(), strict=True)
    }
    assert got == {i: v[2:6] for i, v in enumerate(values)}


# --- inline payloads straight from the data files (rows/lance/inline_blobs.py) ----------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),  # fragment
            st.integers(0, 200),  # file offset, unless it follows the previous row
            st.integers(0, 6),  # size
            st.sampled_from([None, 0, 3, MAX_GAP, MAX_GAP + 1]),  # gap after the previous
        ),
        max_size=30,
    )
)
def test_inline_runs_read_each_payload_into_its_place(rows) -> None:
    """Any rows (fragment, file offset, size; or placed a gap after the previous row's
    payload, so runs form): scattering each run's file bytes as its pieces say gives each
    row's bytes at its offsets, and a run never spans two files or a gap over MAX_GAP."""
    fragments, positions, sizes = [], [], []
    for fragment, at, size, gap in rows:
        if gap is not None and fragments and sizes[-1]:
            fragment, at = fragments[-1], positions[-1] + sizes[-1] + gap
        fragments.append(fragment)
        positions.append(at)
        sizes.append(size)
    length = max((p + n for p, n in zip(positions, sizes, strict=True)), default=0)
    files = [np.random.default_rng(f).bytes(length) for f in range(3)]
    plan = inline_runs(np.array(fragments), np.array(positions), np.array(sizes))
    out = bytearray(int(plan.offsets[-1]))
    for lo, hi in itertools.pairwise(plan.runs.tolist()):
        run = plan.rows[lo:hi]
        assert len(set(plan.fragments[lo:hi].tolist())) == 1
        ends = plan.positions[lo:hi] + plan.sizes[lo:hi]
        assert ((plan.positions[lo + 1 : hi] - ends[:-1]) <= MAX_GAP).all()
        assert ((plan.positions[lo + 1 : hi] - ends[:-1]) >= 0).all()
        for row in run.tolist():
            f, p, n = fragments[row], positions[row], sizes[row]
            out[plan.offsets[row] : plan.offsets[row] + n] = files[f][p : p + n]
    got = [bytes(out[lo:hi]) for lo, hi in itertools.pairwise(plan.offsets.tolist())]
    assert got == [files[f][p : p + n] for f, p, n in zip(fragments, positions, sizes, strict=True)]
    assert sorted(plan.rows.tolist()) == [i for i, n in enumerate(sizes) if n]
    followers = sum(
        1
        for (f0, p0, n0), (f1, p1, n1) in itertools.pairwise(
            [r for r in zip(fragments, positions, sizes, strict=True) if r[2]]
        )
        if f0 == f1 and 0 <= p1 - p0 - n0 <= MAX_GAP
    )
    assert plan.run_count == len(plan.rows) - followers


@pytest.fixture(scope="module")
def layered_uri(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[bytes | None]]:
    """60 rows of 0-3,000-byte payloads (nulls, empty blobs) in 3 fragments, rows deleted,
    and a column added afterwards (a second data file per fragment)."""
    rng = np.random.default_rng(3)
    values: list[bytes | None] = [
        None if i % 7 == 3 else b"" if i % 11 == 5 else rng.bytes(int(rng.integers(1, 3000)))
        for i in range(60)
    ]
    uri = str(tmp_path_factory.mktemp("blobs") / "layered.lance")
    ds = lance.write_dataset(blob_table(values), uri, max_rows_per_file=20)
    ds.delete("id % 9 = 4")
    ds.add_columns({"twice": "id * 2"})
    return uri, values


@pytest.mark.parametrize("order", ["sequential", "shuffled", "blocks"])
def test_inline_payloads_are_read_from_the_files_in_runs_and_equal_read_blobs(
    layered_uri, order: str
) -> None:
    """Today every read of a blob column pays Lance's read_blobs (a bytes object per row, then
    a copy): a sequential read of inline blobs now reads a few runs straight from the files,
    counted in the read's I/O, with the same payloads as read_blobs; scattered rows still get
    read_blobs."""
    uri, values = layered_uri
    source = Source(uri)
    n = source.num_rows
    positions = {
        "sequential": np.arange(n),
        "shuffled": np.random.default_rng(0).permutation(n),
        "blocks": np.concatenate([np.arange(20, n), np.arange(0, 20)]),
    }[order]
    read = source.read_rows(positions)
    ids = read.rows.column("id").to_pylist()
    got = read.rows.column("image").to_pylist()
    assert got == [values[i] for i in ids]
    offsets = source.row_offsets(positions).tolist()
    assert got == [b for _, b in lance.dataset(uri).read_blobs("image", indices=offsets)]
    payload = sum(len(values[i] or b"") for i in ids)
    direct = order != "shuffled"
    if direct:
        assert read.io_bytes >= payload  # the payloads count as read bytes (stats())
    runs = source.read_rows(positions)  # the same read again, counted alone
    assert (runs.io_bytes >= payload) if direct else True
    if direct:  # a few preads (one per fragment or block run), not one per row
        assert runs.io_iops <= 8 + 2 * 3
    descriptors = Source(uri, blobs={"image": "descriptor"}).read(positions).column("image")
    io = StorageIO()
    payloads = read_blob_payloads(lance.dataset(uri), "image", np.array(offsets), descriptors, io)
    assert payloads.to_pylist() == got
    inline_bytes, preads = io.bytes, io.reads
    if direct:  # the payloads, plus the padding and deleted rows' payloads between them
        assert payload <= inline_bytes <= 1.3 * payload + 64 * len(ids)
    else:
        assert (inline_bytes, preads) == (0, 0)
    assert preads <= 6  # sequential: a run per fragment; blocks: one more


def test_packed_blobs_come_through_read_blobs(tmp_path) -> None:
    """Payloads above Lance's inline threshold live in other files (packed): read_blobs reads
    them, never this module's preads."""
    uri = str(tmp_path / "packed.lance")
    rng = np.random.default_rng(1)
    values = [rng.bytes(100_000), None, b"", rng.bytes(100_000)]
    lance.write_dataset(blob_table(values), uri)
    assert Source(uri).read(np.arange(4)).column("image").to_pylist() == values


@pytest.mark.parametrize("storage", ["2.0", "2.1"])
def test_blob_v1_columns_come_through_read_blobs(tmp_path, storage: str) -> None:
    """A blob v1 column (large_binary tagged lance-encoding:blob; descriptors of position and
    size only) reads its payloads through read_blobs, not the inline path."""
    field = pa.field("image", pa.large_binary(), metadata={"lance-encoding:blob": "true"})
    values = [bytes([i]) * 1000 for i in range(40)]
    table = pa.table(
        [pa.array(range(40)), pa.array(values, pa.large_binary())],
        schema=pa.schema([pa.field("id", pa.int64()), field]),
    )
    uri = str(tmp_path / "v1.lance")
    lance.write_dataset(table, uri, data_storage_version=storage)
    assert Source(uri).read(np.arange(40)).column("image").to_pylist() == values


def test_a_data_file_shorter_than_its_descriptors_is_an_error_naming_it(tmp_path) -> None:
    """A file replaced or truncated under the reader: an OSError naming it, never zeros."""
    path = tmp_path / "short.lance"
    path.write_bytes(b"x" * 100)
    files = FragmentFiles(np.array([0, 2]), (str(path),))
    plan = inline_runs(np.array([0, 0]), np.array([0, 64]), np.array([60, 60]))
    with pytest.raises(OSError, match=r"short\.lance ends at byte 100.*24 more bytes"):
        read_inline(files, plan, None, 0, StorageIO())


def test_inline_reads_run_on_the_checked_pylance_and_a_local_path_in_any_cwd(
    tmp_path, monkeypatch
) -> None:
    """The installed pylance is one whose layout these tests check (else every read would
    quietly take the slow path); a relative URI still reads after the process changes
    directory (the files' paths are absolute)."""
    assert lance.__version__.split(".")[0] in CHECKED_VERSIONS
    monkeypatch.chdir(tmp_path)
    lance.write_dataset(blob_table([b"ab", b"cd"]), "rel.lance")
    source = Source("rel.lance")
    assert fragment_files(source.dataset, "image") is not None
    descriptors = Source("rel.lance", blobs={"image": "descriptor"}).read(np.arange(2))
    monkeypatch.chdir("/")
    assert source.read(np.arange(2)).column("image").to_pylist() == [b"ab", b"cd"]
    io = StorageIO()
    payloads = read_blob_payloads(source.dataset, "image", np.arange(2), descriptors["image"], io)
    assert payloads.to_pylist() == [b"ab", b"cd"] and io.bytes >= 4


def test_decode_images_reads_binary_view_columns() -> None:
    """Today decode_images refuses binary_view (what Arrow builds from bytes without a copy)."""
    column = pa.array([jpeg(1), jpeg(2)], pa.binary_view())
    out = ll.decode_images("image")(pa.record_batch({"image": column}))
    expected = np.stack([np.asarray(Image.open(io.BytesIO(jpeg(i)))) for i in (1, 2)])
    assert np.array_equal(out["image"].to_numpy_ndarray(), expected)


# --- ranges straight from the files (rows/lance/blob_files.py) -------------------------------------


class Kinds(tuple):
    """(uri, values) of the every-kind dataset, shown short in a failing example."""

    def __repr__(self) -> str:
        return f"Kinds({self[0]!r}, {len(self[1])} values)"


@pytest.fixture(scope="module")
def every_kind_uri(tmp_path_factory) -> Kinds:
    """Inline (small), packed (100-300 KB) and dedicated (6 MB) blobs, a null and an empty one,
    in three fragments: each kind's file naming and positions are used."""
    rng = np.random.default_rng(7)
    sizes = [30, 5_000, 100_000, 0, 6_000_000, 250_000, 64, 6_000_000, 120_000] * 3
    values: list[bytes | None] = [rng.bytes(n) for n in sizes]
    values[3] = values[21] = None
    uri = str(tmp_path_factory.mktemp("kinds") / "kinds.lance")
    lance.write_dataset(blob_table(values), uri, max_rows_per_file=9)
    kinds = lance.dataset(uri).to_table(columns=["image"]).column("image").combine_chunks()
    kinds = kinds.storage if isinstance(kinds, pa.ExtensionArray) else kinds
    assert set(kinds.field("kind").to_pylist()) >= {0, 1, 2}  # all three are used
    return Kinds((uri, values))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 26), st.floats(0, 1), st.floats(0, 1)), max_size=12))
def test_ranges_read_from_the_files_equal_read_blob_ranges(every_kind_uri, asks) -> None:
    """Any ranges of any blobs (inline, packed, dedicated; empty ones too), read by pread from
    the files, are Lance's read_blob_ranges bytes, and the reads count as blob I/O; a call
    that asks for a null blob is Lance's (None here)."""
    uri, values = every_kind_uri
    ds = lance.dataset(uri)
    offsets = np.arange(len(values))
    descriptors = ds.to_table(columns=["image"]).column("image")
    located = blob_locations(ds, "image", offsets, descriptors)
    present = np.array([v is not None for v in values])
    assert located is not None and (located.file[present] >= 0).all()
    requests = []
    for row, a, b in asks:
        size = len(values[row] or b"")
        lo = int(a * size)
        requests.append((row, lo, int(b * (size - lo))))
    io = StorageIO()
    got = located.read_ranges(requests, io)
    if not requests:
        assert got == []
        return
    if not all(present[row] for row, _, _ in requests):
        assert got is None and (io.bytes, io.reads) == (0, 0)
        return
    lance_bytes = [
        data for _, _, data in ds.read_blob_ranges("image", requests, selector="indices")
    ]
    assert got == lance_bytes
    assert (io.bytes, io.reads) == (sum(n for _, _, n in requests), len(requests))


def test_a_range_outside_its_blob_or_an_external_blob_goes_to_lance(
    every_kind_uri, tmp_path
) -> None:
    """A range past a blob's end is not read here (Lance answers it, as it would), and a blob
    whose file is missing is never located: the caller falls back to read_blob_ranges."""
    uri, values = every_kind_uri
    ds = lance.dataset(uri)
    descriptors = ds.to_table(columns=["image"]).column("image")
    located = blob_locations(ds, "image", np.arange(len(values)), descriptors)
    assert located.read_ranges([(0, 0, 31)], StorageIO()) is None  # the blob holds 30 bytes
    assert located.read_ranges([(99, 0, 1)], StorageIO()) is None  # no such row
    # a copy of the dataset without its sidecar files: those blobs are not located
    import shutil

    copy = tmp_path / "copy.lance"
    shutil.copytree(uri, copy)
    for sidecar in copy.glob("data/*/*.blob"):
        sidecar.unlink()
    gone = lance.dataset(str(copy))
    found = blob_locations(gone, "image", np.arange(len(values)), descriptors)
    sizes = [len(v or b"") for v in values]
    assert found.read_ranges([(2, 0, 10)], StorageIO()) is None  # packed: its file is gone
    assert found.read_ranges([(1, 0, 10)], StorageIO()) == [
        values[1][:10]
    ]  # inline: in the data file
    assert sizes[1] < 64 * 1024


def test_a_sidecar_shorter_than_its_descriptors_is_an_error_naming_it(tmp_path) -> None:
    """A sidecar truncated under the reader: an OSError naming it, never short bytes."""
    uri = str(tmp_path / "cut.lance")
    values = [np.random.default_rng(2).bytes(200_000)]
    lance.write_dataset(blob_table(values), uri)
    ds = lance.dataset(uri)
    located = blob_locations(ds, "image", np.arange(1), ds.to_table().column("image"))
    (sidecar,) = located.paths
    assert sidecar.endswith(sidecar_name(1))
    with open(sidecar, "r+b") as f:
        f.truncate(100_000)
    with pytest.raises(OSError, match=r"\.blob ends at byte 100000"):
        located.read_ranges([(0, 90_000, 20_000)], StorageIO())


def test_blob_v1_and_object_stores_are_not_located(tmp_path) -> None:
    """Blob v1 descriptors (position and size only) name no file: nothing is located."""
    field = pa.field("image", pa.large_binary(), metadata={"lance-encoding:blob": "true"})
    table = pa.table(
        [pa.array([0]), pa.array([b"x" * 1000], pa.large_binary())],
        schema=pa.schema([pa.field("id", pa.int64()), field]),
    )
    uri = str(tmp_path / "v1.lance")
    ds = lance.write_dataset(table, uri, data_storage_version="2.1")
    assert blob_locations(ds, "image", np.arange(1), ds.to_table().column("image")) is None
