"""Per-sample augmentation: the same draws for the same sample across worker counts, worker
types, batch sizes, world sizes and resumes; fresh draws each epoch."""

from __future__ import annotations

import io

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import lanceloader as ll
import workerfns


def _draws(loader, epochs=1) -> dict[tuple[int, int], float]:
    out = {}
    for _ in range(epochs):
        epoch = loader.epoch
        for b in loader:
            out.update({(epoch, int(i)): float(r) for i, r in zip(b["id"], b["r"], strict=True)})
    return out


def _loader(uri, **kw) -> ll.Loader:
    return ll.Loader(
        uri, columns=["id"], shuffle=True, seed=7, transform=ll.random_map(workerfns.draw), **kw
    )


def test_draws_belong_to_the_sample(small_uri) -> None:
    base = _draws(_loader(small_uri, batch_size=32, num_workers=1), epochs=2)
    assert len(base) == 2000
    assert _draws(_loader(small_uri, batch_size=7, num_workers=3), epochs=2) == base
    assert (
        _draws(_loader(small_uri, batch_size=32, num_workers=2, worker_type="process"), epochs=2)
        == base
    )
    first = [base[(0, i)] for i in range(1000)]
    second = [base[(1, i)] for i in range(1000)]
    assert first != second  # a new epoch draws anew (the same row is another sample there)
    assert len(set(first)) == 1000


@settings(max_examples=8, deadline=None)
@given(cut=st.integers(1, 20), before=st.integers(1, 3), after=st.integers(1, 3))
def test_a_resumed_run_draws_what_the_uninterrupted_run_drew(small_uri, cut, before, after) -> None:
    base = _draws(_loader(small_uri, batch_size=16, num_workers=1))
    ranks = [
        _loader(small_uri, batch_size=16, num_workers=1, rank=r, world_size=before)
        for r in range(before)
    ]
    its = [iter(r) for r in ranks]
    seen = {}
    for _ in range(cut):
        for it in its:
            b = next(it)
            seen.update({(0, int(i)): float(r) for i, r in zip(b["id"], b["r"], strict=True)})
    state = ranks[0].state_dict()
    for r in ranks:
        r.close()
    for r in range(after):
        resumed = _loader(small_uri, batch_size=8, num_workers=2, rank=r, world_size=after)
        resumed.load_state_dict(state, allow_changes=("batch_size",))
        seen.update(_draws(resumed))
    assert seen == base


def test_skipped_rows_keep_the_others_draws(small_uri) -> None:
    base = _draws(_loader(small_uri, batch_size=32))
    loader = ll.Loader(
        small_uri,
        columns=["id"],
        shuffle=True,
        seed=7,
        batch_size=32,
        on_error="skip",
        max_skip_fraction=1.0,
        transform=[ll.map_rows(workerfns.fail_on_odd_id), ll.random_map(workerfns.draw)],
    )
    got = _draws(loader)
    assert got and all(i % 2 == 0 for _, i in got)
    assert got == {k: v for k, v in base.items() if k in got}


def test_random_map_after_a_row_changing_transform_is_refused(small_uri) -> None:
    def halve(batch):
        return batch.slice(0, batch.num_rows // 2)

    halve.changes_rows = True
    loader = ll.Loader(
        small_uri, columns=["id"], batch_size=8, transform=[halve, ll.random_map(workerfns.draw)]
    )
    with pytest.raises(ValueError, match="put random transforms before it"):
        next(iter(loader))


def test_vision_recipe_crops_and_flips_chw_images(tmp_path) -> None:
    pytest.importorskip("torch")
    rows = []
    for i in range(24):
        buf = io.BytesIO()
        pixels = np.random.default_rng(i).integers(0, 255, (10, 12, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buf, format="PNG")
        rows.append(buf.getvalue())
    uri = str(tmp_path / "images.lance")
    lance.write_dataset(
        pa.table({"image": pa.array(rows, pa.binary()), "label": np.arange(24) % 3}), uri
    )
    transform = [ll.decode_images("image", layout="CHW"), ll.random_map(workerfns.crop_flip)]
    outs = []
    for kw in ({"num_workers": 1}, {"num_workers": 2, "worker_type": "process"}):
        loader = ll.Loader(
            uri, batch_size=8, shuffle=True, transform=transform, output="torch", **kw
        )
        outs.append([b["image"] for b in loader])
    assert tuple(outs[0][0].shape) == (8, 3, 6, 6)
    assert all((a == b).all() for a, b in zip(*outs, strict=True))


def test_every_bit_of_the_seeds_counts() -> None:
    """Seeds used to be cut to their low 32 bits: 7 and 7 + 2**32 drew the same."""
    from lanceloader.batch.augment import sample_rng

    def draw(*numbers: int) -> int:
        return int(sample_rng(*numbers).integers(1 << 62))

    assert draw(7, 0, 0, 0) != draw(7 + 2**32, 0, 0, 0)
    assert draw(0, 7, 0, 0) != draw(0, 7 + 2**32, 0, 0)
    assert draw(-7, 0, 0, 0) != draw(7, 0, 0, 0)
    assert draw(5, 1, 2, 3) == draw(5, 1, 2, 3)
