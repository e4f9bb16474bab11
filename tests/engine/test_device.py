"""The device stage (``engine/device.py``) and GPU image decode (``batch/images.py``).

Everywhere: the stage's contract on CPU tensors (``device="cpu"`` runs the same queue, order,
bounds, ownership and stats as CUDA; the copy is the tensor itself), JAX placement on the CPU
device, the GPU decode's CPU fallback and its errors. Where CUDA is present: the same on the GPU,
copies hidden behind a step, and GPU decode against the CPU path.
"""

from __future__ import annotations

import dataclasses
import gc
import io
import sys
import time
import types

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch

import lanceloader as ll
from checkpointing import assert_checkpoint_conformance
from conftest import lanceloader_threads
from lanceloader.batch.images import decode_images, normalise
from lanceloader.batch.images_gpu import DEVICE_TOLERANCE, finish_images
from lanceloader.batch.transforms import apply_transform
from lanceloader.demo import write_demo_dataset
from lanceloader.engine.device import DeviceQueue, Slot, check_placement
from lanceloader.engine.stream import Stream

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
BATCH_BYTES = 8 * (64 * 4 + 8)  # 8 rows of x (64 float32) and id (int64)


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_demo_dataset(tmp_path_factory.mktemp("device") / "d.lance", rows=320, fragments=2)


def loader(uri: str, **kwargs) -> ll.Loader:
    """8-row batches of id and x as torch, two read batches per task (a transform)."""
    settings = {
        "columns": ["id", "x"],
        "output": "torch",
        "shuffle": True,
        "seed": 3,
        "transform": lambda b: b,
        "num_workers": 2,
        **kwargs,
    }
    return ll.Loader(uri, 8, **settings)


def slowly(batches, seconds: float = 0.003) -> list:
    """The batches, taken by a loop whose step takes ``seconds``: the workers run ahead."""
    out = []
    for b in batches:
        time.sleep(seconds)
        out.append(b)
    return out


# --- the queue, alone ---------------------------------------------------------------------------


def batch(i: int, rows: int = 2) -> dict:
    return {"x": torch.full((rows,), i), "name": [f"b{i}"] * rows}


def test_the_queue_copies_in_stream_order_within_its_bounds() -> None:
    queue = check_placement("torch", False, "cpu", prefetch=2).queue()
    later = queue.register(range(4, 8, 2), [batch(4), batch(6)])  # a later task first
    assert queue.ahead == (2, 32)  # before any arrival: from the first registered
    first = queue.register(range(0, 4, 2), [batch(0), batch(2)])
    assert queue.ahead == (2, 32) and len(queue) == 4  # 0 and 2 wait: 4 and 6 took the room
    assert all(isinstance(s, Slot) for s in first + later)
    out = [queue.arrive(s) for s in first + later]
    assert [int(b["x"][0]) for b in out] == [0, 2, 4, 6]
    assert out[0]["name"] == ["b0", "b0"] and len(queue) == 0 and queue.ahead == (0, 0)


def test_the_next_batch_always_goes_even_over_the_byte_bound() -> None:
    queue = check_placement("torch", False, "cpu", prefetch=4, prefetch_bytes=20).queue()
    slots = queue.register(range(3), [batch(0), batch(1), batch(2)])  # 16 bytes each
    assert queue.ahead == (1, 16)  # one always may; a second would pass 20 bytes
    queue.arrive(slots[0])
    assert queue.ahead == (1, 16)  # the next one went on arrival of the first


def test_a_batch_without_tensors_passes_as_it_is() -> None:
    queue = check_placement("torch", False, "cpu").queue()
    made = [{"name": ["a", "b"]}]
    assert queue.register(range(1), made) == made
    assert queue.arrive(made[0]) is made[0]


def test_slots_dropped_by_their_task_leave_the_queue() -> None:
    """The queue points at slots weakly: results a closed stream drops take their copies."""
    queue = check_placement("torch", False, "cpu", prefetch=8).queue()
    slots = queue.register(range(3), [batch(0), batch(1), batch(2)])
    assert len(queue) == 3 and queue.ahead[0] == 3
    del slots
    gc.collect()
    assert len(queue) == 0 and queue.ahead == (0, 0)


# --- the stage in a loader, on CPU tensors -----------------------------------------------------


def test_order_is_the_loaders_with_and_without_the_stage(uri: str) -> None:
    expected = [b["id"].tolist() for b in loader(uri)]
    for kwargs in (
        {"device_prefetch": 3},
        {"device_prefetch": 0},
        {"num_workers": 1},
        {"transform": None, "device_prefetch": 1},
    ):
        staged = loader(uri, device="cpu", **kwargs)
        assert [b["id"].tolist() for b in slowly(staged, 0.001)] == expected, kwargs
        assert staged.stats().copy_batches == len(expected)


def test_the_device_holds_at_most_device_prefetch_batches_ahead(uri: str) -> None:
    for depth in (1, 3):
        staged = loader(uri, device="cpu", device_prefetch=depth, prefetch=16)
        got = slowly(staged, 0.005)
        s = staged.stats()
        assert s.device_ahead_max == depth  # reached (the workers run ahead), never passed
        assert s.device_ahead_bytes_max == depth * BATCH_BYTES
        assert s.copies_late <= 2  # only at the start: afterwards every copy was ahead
        assert s.copy_batches == len(got) and s.copy_bytes == len(got) * BATCH_BYTES


def test_the_device_holds_at_most_device_prefetch_bytes_ahead(uri: str) -> None:
    staged = loader(
        uri,
        device="cpu",
        device_prefetch=8,
        prefetch=16,
        device_prefetch_bytes=int(2.5 * BATCH_BYTES),
    )
    slowly(staged, 0.005)
    s = staged.stats()
    assert (s.device_ahead_max, s.device_ahead_bytes_max) == (2, 2 * BATCH_BYTES)


def test_device_prefetch_zero_copies_each_batch_on_arrival(uri: str) -> None:
    staged = loader(uri, device="cpu", device_prefetch=0)
    n = len(slowly(staged, 0.0))
    s = staged.stats()
    assert (s.copies_late, s.device_ahead_max) == (n, 0)


def test_process_workers_batches_are_copied_on_arrival(uri: str) -> None:
    expected = [b["id"].tolist() for b in loader(uri, transform=None)]
    staged = loader(uri, transform=None, device="cpu", worker_type="process", num_workers=2)
    assert [b["id"].tolist() for b in staged] == expected
    assert staged.stats().copies_late == len(expected)


def test_a_break_a_close_and_an_error_leave_nothing_behind(uri: str) -> None:
    staged = loader(uri, device="cpu", prefetch=16, device_prefetch=4)
    reading = staged.reading(2)
    queue: DeviceQueue = reading.placement.__self__
    stream = Stream(reading, 0, staged.plan(), range(len(staged)), staged.recorder)
    next(stream)
    time.sleep(0.05)  # the workers fill the queue
    assert len(queue) > 0 and queue.ahead[0] == 4
    start = time.perf_counter()
    stream.close()
    assert time.perf_counter() - start < 0.5
    gc.collect()
    assert len(queue) == 0  # the closed stream's results, and their copies, are gone

    for _ in staged:  # a break: the iterator is collected at once
        break
    gc.collect()
    assert not lanceloader_threads()

    def fail(b):
        fail.calls += 1
        if fail.calls == 4:
            raise ValueError("bad batch")
        return b

    fail.calls = 0
    broken = loader(uri, device="cpu", transform=fail, num_workers=1)
    with pytest.raises(ValueError, match="bad batch"):
        list(broken)
    gc.collect()
    assert not lanceloader_threads()


def test_resume_is_unaffected_by_the_stage(uri: str) -> None:
    plain, staged = loader(uri), loader(uri, device="cpu", device_prefetch=3, prefetch=16)
    a, b = iter(plain), iter(staged)
    for _ in range(5):
        next(a), next(b)
    time.sleep(0.05)  # batches wait on the device: a state counts what the loop received
    state = staged.state_dict()
    assert state == plain.state_dict()
    b.close()
    resumed = loader(uri, device="cpu", device_prefetch=3)
    resumed.load_state_dict(state)
    assert [x["id"].tolist() for x in resumed] == [x["id"].tolist() for x in a]


def test_checkpoint_conformance_with_the_stage(tmp_path) -> None:
    small = write_demo_dataset(tmp_path / "s.lance", rows=40)
    assert_checkpoint_conformance(
        lambda: ll.Loader(
            small,
            8,
            columns=["id"],
            output="torch",
            device="cpu",
            device_prefetch=2,
            shuffle=True,
            num_workers=2,
        ),
        value=lambda b: b["id"].tolist(),
    )


def test_stats_report_the_copies(uri: str) -> None:
    staged = loader(uri, device="cpu")
    n = len(list(staged))
    s = staged.stats()
    d = s.to_dict()
    for key in (
        "copy_batches",
        "copy_bytes",
        "copy_s",
        "copy_exposed_s",
        "copies_late",
        "device_ahead_max",
        "device_ahead_bytes_max",
        "copy_hidden",
    ):
        assert key in d
    assert (s.copy_batches, s.copy_bytes) == (n, n * BATCH_BYTES)
    assert s.copy_hidden is None  # CPU copies are not timed
    assert "\ndevice " in str(s) and "copied on arrival" in str(s)
    assert "\ndevice " not in str(loader(uri).stats())
    list(staged)  # a second epoch: counts add up, the most ahead is the most of either
    total = staged.stats()
    assert total.copy_batches == 2 * n
    assert total.device_ahead_max == max(staged.stats(e).device_ahead_max for e in (0, 1))


def test_peek_places_the_batch(uri: str) -> None:
    staged = loader(uri, device="cpu")
    assert staged.peek()["id"].tolist() == next(iter(staged))["id"].tolist()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"device_prefetch": 2}, ValueError, "needs device="),
        ({"device": "cpu", "device_prefetch": -1}, ValueError, "device_prefetch must be >= 0"),
        ({"device": "cpu", "device_prefetch_bytes": 1.5}, TypeError, "must be an int"),
        ({"device": "cpu", "output": "numpy"}, ValueError, "need output='torch'"),
        ({"device": "cpu", "output": "jax"}, TypeError, "jax.Device"),
    ],
)
def test_bad_placement_arguments_are_refused(uri: str, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        ll.Loader(uri, 8, columns=["id"], **{"output": "torch", **kwargs})


def test_jax_batches_are_put_on_the_callers_sharding(uri: str) -> None:
    jax = pytest.importorskip("jax")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    expected = [b["id"].tolist() for b in loader(uri, output="numpy")]
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    for target in (jax.devices()[0], NamedSharding(mesh, PartitionSpec("data"))):
        staged = loader(uri, output="jax", device=target, device_prefetch=2)
        got = slowly(staged, 0.001)
        assert [np.asarray(b["id"]).tolist() for b in got] == expected
        assert all(isinstance(b["x"], jax.Array) for b in got)
        if isinstance(target, NamedSharding):
            assert got[0]["x"].sharding.is_equivalent_to(target, 2)
        assert staged.stats().copy_batches == len(got)


# --- GPU decode: the CPU fallback and the errors ---------------------------------------------


def jpeg(pixels: np.ndarray, mode: str = "RGB", quality: int = 90) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def picture(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([128 + 100 * np.sin(x / (9 + 4 * c) + y / (13 + 3 * c)) for c in range(3)], -1)
    return np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)


def test_gpu_decode_names_the_install_when_torchvision_is_missing() -> None:
    if "torchvision" in sys.modules or _importable("torchvision"):
        pytest.skip("torchvision is installed")
    with pytest.raises(ImportError, match="pip install torchvision"):
        decode_images(device="cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_gpu_decode_without_cuda_is_a_clear_error(monkeypatch) -> None:
    vision = types.ModuleType("torchvision")
    vision.io = types.ModuleType("torchvision.io")
    monkeypatch.setitem(sys.modules, "torchvision", vision)
    monkeypatch.setitem(sys.modules, "torchvision.io", vision.io)
    with pytest.raises(ValueError, match="no CUDA device"):
        decode_images(device="cuda")


def test_only_rgb_and_grey_jpegs_go_to_the_gpu_decoder() -> None:
    from PIL import Image

    from lanceloader.batch.images_gpu import _gpu_decodable

    pixels = picture(20, 30)

    def encoded(mode: str, **kwargs) -> np.ndarray:
        out = io.BytesIO()
        Image.fromarray(pixels).convert(mode).save(out, **kwargs)
        return np.frombuffer(out.getvalue(), np.uint8)

    assert _gpu_decodable(encoded("RGB", format="JPEG"))
    assert _gpu_decodable(encoded("L", format="JPEG"))
    assert _gpu_decodable(
        encoded("RGB", format="JPEG", progressive=True, exif=b"Exif\x00\x00" + bytes(3000))
    )
    assert not _gpu_decodable(encoded("CMYK", format="JPEG"))  # the CPU converts CMYK right
    assert not _gpu_decodable(encoded("RGB", format="PNG"))
    assert not _gpu_decodable(np.frombuffer(b"\xff\xd8\xffcorrupt", np.uint8))


def test_gpu_decode_device_argument() -> None:
    assert decode_images(device="cpu").device is None  # the CPU path
    with pytest.raises(ValueError, match="'cuda' or 'cuda:N'"):
        decode_images(device="gpu")


def cmyk_jpeg(pixels: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).convert("CMYK").save(out, format="JPEG", quality=90)
    return out.getvalue()


def test_the_device_path_falls_back_to_the_cpu_and_reports_corrupt_rows() -> None:
    """The device path with its GPU decoder left out (``device="cpu"``): every row goes through
    the fallback, as PNG, CMYK and refused JPEGs do on a GPU; a corrupt row is skipped."""
    pics = [picture(40, 60, i) for i in range(3)]
    rows = [jpeg(pics[0]), png(pics[1]), cmyk_jpeg(pics[2]), b"\xff\xd8\xffcorrupt", None]
    batch = pa.record_batch({"image": pa.array(rows, pa.binary()), "label": list(range(5))})
    on_cpu = decode_images(size=(32, 48), backend="pil", layout="CHW")
    on_device = dataclasses.replace(on_cpu, device="cpu")
    result, skipped = apply_transform(on_device, batch, "skip")
    assert skipped == 2 and isinstance(result, dict)
    assert result["label"].to_pylist() == [0, 1, 2]  # the kept rows, as Arrow
    images = result["image"]
    assert isinstance(images, torch.Tensor) and tuple(images.shape) == (3, 3, 32, 48)
    reference = apply_transform(on_cpu, batch, "skip").batch.column("image").to_numpy_ndarray()
    assert np.abs(images.numpy().astype(float) - reference).mean() < 1.5
    with pytest.raises(Exception, match="row 3"):  # raise: names the row, like the CPU path
        on_device(batch)
    other = pa.record_batch({"image": pa.array([jpeg(pics[0]), jpeg(picture(30, 30))])})
    assert (
        apply_transform(dataclasses.replace(decode_images(), device="cpu"), other, "skip").skipped
        == 1
    )  # no size: another size is a row error


def test_the_device_path_refuses_process_workers(uri: str, tmp_path) -> None:
    pics = [jpeg(picture(20, 20, i)) for i in range(4)]
    images = lance.write_dataset(
        pa.table({"image": pa.array(pics, pa.binary())}), str(tmp_path / "img.lance")
    ).uri
    transform = dataclasses.replace(decode_images(size=8), device="cpu")
    with pytest.raises(RuntimeError, match="runs in thread workers"):
        list(
            ll.Loader(
                images, 2, transform=transform, output="torch", worker_type="process", num_workers=1
            )
        )
    batches = list(ll.Loader(images, 2, transform=transform, output="torch"))
    assert [tuple(b["image"].shape) for b in batches] == [(2, 8, 8, 3)] * 2


@pytest.mark.parametrize("backend", ["pil", "auto"])
def test_the_device_arithmetic_matches_the_cpu_path(backend: str) -> None:
    """Resize and normalise as the GPU path does (torch ops, here on the CPU) after a full
    decode, against the CPU path: within DEVICE_TOLERANCE, and within 1.5 of Pillow's."""
    from lanceloader.batch.images import _decode_pil

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    for h, w in ((375, 500), (256, 256), (600, 420), (224, 224), (150, 200)):
        data = jpeg(picture(h, w, h))
        cpu = (
            decode_images(size=224, backend=backend, layout="CHW")(
                pa.record_batch({"image": [data]})
            )
            .column("image")
            .to_numpy_ndarray()
        )
        full = torch.from_numpy(_decode_pil(data, None, "RGB")).permute(2, 0, 1)
        dev = finish_images([full], (224, 224), "uint8", None, None, "CHW", 3).numpy()
        diff = np.abs(cpu.astype(float) - dev).mean()
        assert diff <= (1.5 if backend == "pil" else DEVICE_TOLERANCE), (h, w, diff)
        floats = finish_images([torch.from_numpy(cpu[0])], None, "float32", mean, std, "HWC", 3)
        expected = normalise(cpu.transpose(0, 2, 3, 1), mean, std)
        np.testing.assert_allclose(floats.numpy(), expected, atol=1e-5)


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# --- on a GPU -----------------------------------------------------------------------------------


@cuda
def test_cuda_stage_delivers_the_loaders_batches_with_copies_hidden(uri: str) -> None:
    expected = [b["x"] for b in loader(uri)]
    staged = loader(uri, device="cuda", device_prefetch=2, prefetch=16)
    a = torch.randn(2048, 2048, device="cuda")
    got = []
    for b in staged:
        assert b["x"].is_cuda and b["x"].device.index == torch.cuda.current_device()
        got.append(b["x"].cpu())
        for _ in range(20):  # a step that takes longer than the copy
            a = a @ a / a.norm()
    assert all(torch.equal(x, y) for x, y in zip(got, expected, strict=True))
    torch.cuda.synchronize()
    s = staged.stats()
    assert s.copy_batches == len(expected) and s.copy_s > 0
    assert s.copy_hidden is not None and s.copy_hidden >= 0.8


@cuda
def test_cuda_stage_frees_its_copies_on_close(uri: str) -> None:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    staged = loader(uri, device="cuda", device_prefetch=4, prefetch=16)
    it = iter(staged)
    next(it)
    time.sleep(0.1)
    it.close()
    del it
    gc.collect()
    torch.cuda.synchronize()
    torch.empty(1, device="cuda")  # the allocator frees blocks used by other streams here
    assert torch.cuda.memory_allocated() == before


@cuda
def test_gpu_decode_matches_the_cpu_path_and_falls_back(tmp_path) -> None:
    pytest.importorskip("torchvision")
    pics = [picture(300 + 20 * i, 400 - 10 * i, i) for i in range(6)]
    rows = [jpeg(p) for p in pics[:4]] + [png(pics[4]), cmyk_jpeg(pics[5]), b"\xff\xd8\xffbad"]
    batch = pa.record_batch({"image": pa.array(rows, pa.binary()), "label": list(range(7))})
    cpu = apply_transform(decode_images(size=224, layout="CHW"), batch, "skip")
    gpu = apply_transform(decode_images(size=224, layout="CHW", device="cuda"), batch, "skip")
    assert gpu.skipped == cpu.skipped == 1
    images = gpu.batch["image"]
    assert images.is_cuda and tuple(images.shape) == (6, 3, 224, 224)
    reference = cpu.batch.column("image").to_numpy_ndarray().astype(float)
    per_image = np.abs(images.cpu().numpy() - reference).mean(axis=(1, 2, 3))
    assert (per_image <= DEVICE_TOLERANCE).all(), per_image
    again = apply_transform(decode_images(size=224, layout="CHW", device="cuda"), batch, "skip")
    assert torch.equal(again.batch["image"], images)  # deterministic
    uri = lance.write_dataset(
        pa.table({"image": pa.array(rows[:4] * 4, pa.binary())}), str(tmp_path / "i.lance")
    ).uri
    transform = decode_images(size=64, dtype="float32", layout="CHW", device="cuda")
    made = ll.Loader(uri, 4, transform=transform, output="torch", device="cuda")
    first = [b["image"].cpu() for b in made]
    again_loader = ll.Loader(uri, 4, transform=transform, output="torch", device="cuda")
    it = iter(again_loader)
    next(it), next(it)
    state_after_two = again_loader.state_dict()
    it.close()
    resumed = ll.Loader(uri, 4, transform=transform, output="torch", device="cuda")
    resumed.load_state_dict(state_after_two)
    assert all(torch.equal(x["image"].cpu(), y) for x, y in zip(resumed, first[2:], strict=True))
