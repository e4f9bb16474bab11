"""Every kind of rows keeps the rows protocol (``conformance.py``), and a new kind is one class:
:class:`ArrayRows` (rows of NumPy arrays, written here and nowhere else) passes the same checks
and works with the Loader (orders, resume), the ledger, ``stats()`` and a mix, touching no other
file."""

from __future__ import annotations

import hashlib

import lance
import numpy as np
import pyarrow as pa
import pytest
from conformance import assert_rows_conformance

import lanceloader as ll
from lanceloader.demo import write_demo_dataset
from lanceloader.rows.protocol import DatasetName, Read, RowsBase
from media_datasets import audio_dataset, video_dataset


class ArrayRows(RowsBase):
    """Rows of NumPy arrays of equal length: position *p* is row *p* of every array."""

    def __init__(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        self.table = pa.table(arrays)
        digest = hashlib.blake2b(digest_size=8)
        for column in self.table.columns:
            digest.update(np.ascontiguousarray(column.to_numpy()).tobytes())
        self.dataset_name = DatasetName(f"numpy:{name}", None, digest.hexdigest())
        self.columns = self.table.column_names
        self.bytes_per_row = self.table.nbytes / max(1, self.table.num_rows)

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    def schema_table(self) -> pa.Table:
        return self.table.schema.empty_table()

    def settings(self) -> dict:
        return {}

    def read_rows(self, positions: np.ndarray, epoch: int = 0) -> Read:
        return Read(self.table.take(pa.array(np.asarray(positions, np.int64))))


def array_rows(n: int = 300) -> ArrayRows:
    return ArrayRows(
        "squares", {"id": np.arange(n, dtype=np.int64), "x": (np.arange(n, dtype=np.float32) ** 2)}
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> str:
    return write_demo_dataset(tmp_path_factory.mktemp("demo") / "d.lance", rows=600, fragments=3)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> str:
    lengths = np.random.default_rng(5).integers(1, 40, 200)
    docs = [list(range(d * 1000, d * 1000 + k)) for d, k in enumerate(lengths.tolist())]
    uri = str(tmp_path_factory.mktemp("tokens") / "t.lance")
    lance.write_dataset(
        pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), uri, max_rows_per_file=70
    )
    return uri


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> str:
    pytest.importorskip("av")
    return video_dataset(tmp_path_factory.mktemp("videos"), [20, 13, 27])


@pytest.fixture(scope="module")
def sounds(tmp_path_factory) -> str:
    pytest.importorskip("av")
    return audio_dataset(tmp_path_factory.mktemp("audio"), [0.6, 0.35])


KINDS = {
    "lance": lambda d: (
        ll.Loader(
            d["demo"],
            columns=["id", "label"],
            filter="label < 7",
            splits={"a": 0.8, "b": 0.2},
            split="a",
            cache=None,
        ).source
    ),
    "lance, cached": lambda d: (
        ll.Loader(d["demo"], columns=["id", "x"], cache="memory", shuffle=True).source
    ),
    "packed": lambda d: (
        ll.Loader(
            d["tokens"], columns=["input_ids"], pack=ll.pack("input_ids", 32, pad_id=-1)
        ).source
    ),
    "video clips": lambda d: (
        ll.Loader(d["videos"], clips=ll.video_clips(frames=3, stride=2, per_video=2)).source
    ),
    "audio clips": lambda d: (
        ll.Loader(d["sounds"], clips=ll.audio_clips(seconds=0.1, step=0.05)).source
    ),
    "mix": lambda d: ll.Mix(
        {
            "a": ll.Loader(d["demo"], columns=["id"], shuffle=True),
            "b": ll.Loader(d["demo"], columns=["id"], filter="id < 100"),
        },
        weights={"a": 2, "b": 1},
    ).source(),
    "mix, scheduled": lambda d: ll.Mix(  # placed for the conformance loader's batch of 2
        {
            "a": ll.Loader(d["demo"], columns=["id"], shuffle=True),
            "b": ll.Loader(d["demo"], columns=["id"], filter="id < 100"),
        },
        weights=ll.Schedule({0: {"a": 2, "b": 1}, 2: {"a": 1, "b": 3}}, ramps={2: 3}),
    ).source(global_batch=2),
    "numpy": lambda d: array_rows(),
    "mix with numpy": lambda d: ll.Mix(
        {
            "lance": ll.Loader(d["demo"], columns=["id"]),
            "numpy": ll.Loader(
                ArrayRows("ids", {"id": np.arange(50, dtype=np.int64) * 10}), shuffle=True
            ),
        }
    ).source(),
}


@pytest.fixture(scope="module")
def datasets(demo, tokens, videos, sounds) -> dict[str, str]:
    return {"demo": demo, "tokens": tokens, "videos": videos, "sounds": sounds}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_keeps_the_rows_protocol(kind, datasets) -> None:
    assert_rows_conformance(KINDS[kind](datasets))


def test_a_new_kind_is_one_class_the_loader_orders_and_resumes() -> None:
    rows = array_rows(1000)
    loader = ll.Loader(rows, batch_size=64, shuffle=True, seed=3, num_workers=2)
    epoch = [i for batch in loader for i in batch["id"].tolist()]
    assert sorted(epoch) == list(range(1000)) and epoch != sorted(epoch)
    again = ll.Loader(rows, batch_size=64, shuffle=True, seed=3)
    it = iter(again)
    first = [next(it)["id"].tolist() for _ in range(5)]
    state = again.state_dict()
    resumed = ll.Loader(array_rows(1000), batch_size=64, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    rest = [i for batch in resumed for i in batch["id"].tolist()]
    assert [i for b in first for i in b] + rest == epoch
    with pytest.raises(ll.StateMismatchError):  # other arrays: another dataset identity
        ll.Loader(
            ArrayRows(
                "squares", {"id": np.arange(1000)[::-1].copy(), "x": np.zeros(1000, np.float32)}
            ),
            batch_size=64,
            shuffle=True,
            seed=3,
        ).load_state_dict(state)


def test_a_new_kind_has_a_ledger_stats_and_refuses_dataset_settings() -> None:
    rows = array_rows(200)
    loader = ll.Loader(rows, batch_size=32, shuffle=True, seed=1, output="numpy")
    batches = [b["id"].tolist() for b in loader]
    ledger = ll.Ledger(loader)
    assert ledger.rows(epoch=0, step=2)["position"].to_pylist() == batches[2]
    assert ledger.rows(epoch=0, step=2)["uri"].to_pylist() == ["numpy:squares"] * 32
    stats = loader.stats()
    assert stats.rows == 200 and stats.rows_read == 200 and stats.rows_cached == 0
    with pytest.raises(ValueError, match="filter"):
        ll.Loader(rows, filter="id < 3")


def test_a_mix_of_lance_and_a_new_kind_interleaves_both_with_their_lineage(demo) -> None:
    numbers = ArrayRows("tens", {"id": np.arange(60, dtype=np.int64) * 10 + 100_000})
    mix = ll.Mix(
        {"lance": ll.Loader(demo, columns=["id"]), "numbers": ll.Loader(numbers)},
        weights={"lance": 1, "numbers": 1},
        samples_per_epoch=120,
    )
    loader = ll.Loader(mix, batch_size=20)
    got = [i for b in loader for i in b["id"].tolist()]
    assert sorted(i for i in got if i >= 100_000) == sorted(range(100_000, 100_600, 10))
    assert sorted(i for i in got if i < 100_000) == list(range(60))
    rows = ll.Ledger(loader).rows(epoch=0, step=1)
    assert rows["source"].to_pylist().count("numbers") == 10
    offsets = rows["row_offset"].to_pylist()
    for source, offset, position in zip(
        rows["source"].to_pylist(), offsets, rows["position"].to_pylist(), strict=True
    ):
        assert (offset is None) == (source == "numbers")  # NumPy rows have no Lance offset
        assert source == "numbers" or offset == position
