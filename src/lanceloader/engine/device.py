"""Device stage: batches land on the device ahead of the step that needs them.

``Loader(device=...)`` runs it: torch output with ``"cuda"``, ``"cuda:1"`` or ``"cpu"``; JAX
output with a ``jax.Device`` or a ``jax.sharding.Sharding``. What runs where:

* **Worker thread**, once a batch is made (:class:`PlacedWork`): its host tensors are copied
  into page-locked memory (torch's caching host allocator: pinned once, reused as soon as the
  copy that read a block is done, never pinned anew per batch) and the batch becomes a
  :class:`Slot` registered in the stream's :class:`DeviceQueue`; the slot is what the worker
  hands back.
* **Pump** (the worker after registering, the consumer after each arrival; under the queue's
  lock, never waiting): the copies of registered batches are issued in stream order, from the
  next batch the consumer takes, on a copy stream of their own, while the batches issued and
  not yet taken are fewer than ``prefetch`` and hold less than ``prefetch_bytes`` of device
  memory (one batch always may). That is the device prefetch depth; the CPU one (the Loader's
  ``prefetch=``) bounds the batches made, a separate and cheaper memory.
* **Consumer** (the training loop's thread, as each read's batches arrive, in order): a batch
  whose copy is not issued yet (the next one always may be) is issued now; the consumer's
  current stream waits on the copy's event, not the CPU; the tensors are recorded as used by that
  stream (``record_stream``), so their memory is recycled only after the step that reads them.

The stage never reorders: the stream delivers in order and the stage only swaps each batch for
its copy. Ownership: a slot belongs to the task result that holds it, and the queue points at it
weakly, so when a stream ends, breaks, fails or is collected and drops its results, their host
and device memory go with them. Nothing here waits, sleeps or starts a thread.

Stats (``Loader.stats()``): batches and bytes copied, the copies issued on arrival (too late to
overlap), the most batches and bytes ever ahead on the device and, on CUDA, the copies' device
time (events) and the part of it the consumer's stream waited for (``Stats.copy_hidden`` is the
rest), measured once both events completed, so the last copies of a stream may go unmeasured. On
the CPU (``device="cpu"``) the copy is the tensor itself, untimed, and the bookkeeping is the same,
which the tests exercise; the CUDA calls are the ``_cuda_*`` functions below.

JAX: the copy is ``jax.device_put(batch, device)``, asynchronous, issued as above; JAX orders
its use after the transfer.

Example::

    >>> import torch
    >>> placement = check_placement("torch", pin_memory=False, device="cpu", prefetch=2)
    >>> queue = placement.queue()
    >>> slots = queue.register(range(0, 3), [{"x": torch.full((2,), i)} for i in range(3)])
    >>> queue.ahead
    (2, 32)
    >>> [queue.arrive(s)["x"].tolist() for s in slots]
    [[0, 0], [1, 1], [2, 2]]
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lanceloader.arguments import check_int
from lanceloader.engine.stats import Recorder
from lanceloader.engine.work import BatchWork, TaskResult
from lanceloader.ordering.plan import ReadTask

DEFAULT_DEVICE_PREFETCH = 2  # batches ahead on the device: the next step's, and one spare
DEFAULT_DEVICE_PREFETCH_BYTES = 1 << 30  # and at most 1 GiB of device memory


# --- CUDA and JAX calls, each in one small function ---------------------------------------------

_streams: dict[tuple[int, int], Any] = {}  # (pid, device index) -> the copy stream
_streams_lock = threading.Lock()


def _cuda_copy_stream(device: Any) -> Any:
    """The copy stream of ``device`` in this process (one per device, shared by threads)."""
    import os

    import torch

    key = (os.getpid(), device.index)
    with _streams_lock:
        if key not in _streams:
            _streams[key] = torch.cuda.Stream(device)
        return _streams[key]


def _cuda_pin(tensor: Any) -> Any:
    """``tensor`` in page-locked memory (from torch's caching host allocator)."""
    return tensor if tensor.is_cuda or tensor.is_pinned() else tensor.pin_memory()


def _cuda_issue(batch: Any, device: Any) -> tuple[Any, Any]:
    """Issue the copy of ``batch`` to ``device`` on the copy stream; returns the device batch
    and the copy's (start, end) events. Tensors already there (decoded on the GPU) stay."""
    import torch

    stream = _cuda_copy_stream(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(device), torch.cuda.stream(stream):
        start.record(stream)
        out = map_tensors(
            batch, lambda t: t if t.device == device else t.to(device, non_blocking=True)
        )
        end.record(stream)
    return out, (start, end)


def _cuda_hand_over(batch: Any, events: tuple[Any, Any], device: Any) -> Any:
    """Make the consumer's current stream wait for the copy (on the GPU, not the CPU) and
    record that it uses the tensors; returns the event marking when that stream reached the
    wait (for the stats)."""
    import torch

    current = torch.cuda.current_stream(device)
    reached = torch.cuda.Event(enable_timing=True)
    reached.record(current)
    current.wait_event(events[1])
    map_tensors(batch, lambda t: t.record_stream(current) if t.is_cuda else None)
    return reached


def _cuda_elapsed(events: tuple[Any, Any], reached: Any) -> tuple[float, float] | None:
    """(copy seconds, seconds the consumer's stream waited for it), once both are known."""
    start, end = events
    if not (end.query() and reached.query()):
        return None
    copy = start.elapsed_time(end) / 1000
    waited = max(0.0, reached.elapsed_time(end) / 1000)  # the copy ended after the wait began
    return copy, min(copy, waited)


def _jax_issue(batch: Any, target: Any) -> Any:
    """``jax.device_put`` of each array of ``batch`` with ``target`` (a device or sharding):
    asynchronous, JAX orders every use after the transfer."""
    import jax
    import numpy as np

    return jax.tree_util.tree_map(
        lambda x: jax.device_put(x, target) if isinstance(x, jax.Array | np.ndarray) else x, batch
    )


# --- batches as trees of tensors ----------------------------------------------------------------


def map_tensors(value: Any, fn: Callable[[Any], Any]) -> Any:
    """``value`` (a batch: dicts, lists and tuples of tensors and other values) with ``fn``
    applied to each torch tensor.

    >>> import torch
    >>> map_tensors({"x": torch.ones(2), "names": ["a"]}, lambda t: t * 2)["x"].tolist()
    [2.0, 2.0]
    """
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, list | tuple) and any(
        _is_tensor(v) or isinstance(v, dict | list | tuple) for v in value
    ):
        return type(value)(map_tensors(v, fn) for v in value)
    return fn(value) if _is_tensor(value) else value


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "record_stream")


def tensor_bytes(value: Any) -> int:
    """Bytes of the torch tensors in a batch (0: nothing to place)."""
    total = [0]

    def add(t: Any) -> None:
        total[0] += t.numel() * t.element_size()

    map_tensors(value, add)
    return total[0]


def _jax_bytes(value: Any) -> int:
    import jax

    return sum(getattr(leaf, "nbytes", 0) for leaf in jax.tree_util.tree_leaves(value))


# --- the stage ----------------------------------------------------------------------------------


class Slot:
    """One batch on its way to the device: its place in the stream, the batch (staged on the
    host until its copy is issued, then the device copy) and the copy's handle."""

    __slots__ = ("__weakref__", "batch", "copy", "index", "nbytes")

    def __init__(self, index: int, batch: Any, nbytes: int) -> None:
        self.index, self.batch, self.nbytes = index, batch, nbytes
        self.copy: Any = None  # CUDA: the (start, end) events; else True once issued

    def __repr__(self) -> str:
        return f"Slot(batch {self.index}, {self.nbytes:,} bytes, issued={self.copy is not None})"


@dataclass(frozen=True)
class Placement:
    """Where batches go (settings; see :func:`check_placement`): ``device`` (a
    ``torch.device``, a JAX device or sharding, or ``None`` to pin only), ``pin`` (page-lock
    the host tensors), and the device prefetch bounds."""

    framework: str
    device: Any
    pin: bool
    prefetch: int = DEFAULT_DEVICE_PREFETCH
    prefetch_bytes: int = DEFAULT_DEVICE_PREFETCH_BYTES

    @property
    def cuda(self) -> bool:
        return self.framework == "torch" and getattr(self.device, "type", None) == "cuda"

    def queue(self, recorder: Recorder | None = None) -> DeviceQueue:
        """The queue of one stream (its stats go to ``recorder``)."""
        return DeviceQueue(self, recorder)

    def work(self, work: BatchWork, queue: DeviceQueue) -> PlacedWork:
        """``work`` that stages and registers its batches in ``queue`` (thread workers)."""
        fields = {f: getattr(work, f) for f in work.__dataclass_fields__}
        return PlacedWork(**fields, queue=queue)

    def place(self, batch: Any) -> Any:
        """``batch`` placed now, in this thread (``Loader.peek``): no stats, no look-ahead."""
        return DeviceQueue(self).arrive(batch)

    def stage(self, batch: Any) -> Any:
        """What a worker does to a made batch: page-lock its host tensors (CUDA or ``pin``)."""
        if self.framework == "torch" and (self.pin or self.cuda):
            return map_tensors(batch, _cuda_pin)
        return batch

    def nbytes(self, batch: Any) -> int:
        """Device bytes the batch takes (0: nothing to place)."""
        if self.framework == "jax":
            return _jax_bytes(batch) if isinstance(batch, dict) else 0
        return tensor_bytes(batch)


class DeviceQueue:
    """The batches of one stream on their way to the device: registered by workers, copied in
    stream order at most ``prefetch`` batches and ``prefetch_bytes`` bytes ahead of the
    consumer, handed over on arrival. See the module text for what runs where."""

    def __init__(self, placement: Placement, recorder: Recorder | None = None) -> None:
        self.placement = placement
        self._recorder = recorder
        self._lock = threading.RLock()
        self._waiting: weakref.WeakValueDictionary[int, Slot] = weakref.WeakValueDictionary()
        self._ahead: weakref.WeakValueDictionary[int, Slot] = weakref.WeakValueDictionary()
        self._next: int | None = None  # the index of the next batch to arrive
        self._step = 1
        self._timings: list[tuple[tuple[Any, Any], Any]] = []  # CUDA: copies to measure

    @property
    def ahead(self) -> tuple[int, int]:
        """Batches issued to the device and not yet taken, and their bytes."""
        with self._lock:
            slots = list(self._ahead.values())
        return len(slots), sum(s.nbytes for s in slots)

    def __len__(self) -> int:
        """Batches registered and not yet taken (issued or not)."""
        with self._lock:
            return len(self._waiting) + len(self._ahead)

    # --- workers ---------------------------------------------------------------------------

    def register(self, batches: range, made: list[Any]) -> list[Any]:
        """In a worker: stage the task's batches (``batches`` are their numbers in the stream)
        and register them; returns what the task result holds: a slot for each batch with
        something to place, the others as they are. Issues what fits."""
        p = self.placement
        staged = [p.stage(b) for b in made]  # outside the lock: the copies run in parallel
        if p.device is None:  # pin only
            return staged
        out: list[Any] = []
        for index, batch in zip(batches, staged, strict=True):
            nbytes = p.nbytes(batch)
            out.append(Slot(index, batch, nbytes) if nbytes else batch)
        with self._lock:
            self._step = batches.step
            for slot in out:
                if isinstance(slot, Slot):
                    self._waiting[slot.index] = slot
            self._pump()
        return out

    # --- the consumer ----------------------------------------------------------------------

    def arrive(self, item: Any) -> Any:
        """In the consumer, as a batch arrives (in stream order): its device copy, which the
        current stream will not read before the copy is done. Anything but a slot (what a
        process worker or ``peek`` made) is staged and copied now."""
        p = self.placement
        if not isinstance(item, Slot):
            if p.device is None:
                return p.stage(item)
            nbytes = p.nbytes(item)
            if not nbytes:
                return item
            item = Slot(-1, p.stage(item), nbytes)
        with self._lock:
            if item.index >= 0:
                self._waiting.pop(item.index, None)
                self._ahead.pop(item.index, None)
                self._next = item.index + self._step
            late = item.copy is None
            if late:
                self._issue(item)
            self._hand_over(item, late)
            self._pump()
        return item.batch

    # --- under the lock --------------------------------------------------------------------

    def _pump(self) -> None:
        """Issue registered copies in stream order, from the next batch to arrive, within the
        bounds (one batch always may). Never waits."""
        p = self.placement
        if p.prefetch == 0:
            return
        i = self._next
        if i is None:  # before the first arrival: the first batch registered
            known = [*self._waiting.keys(), *self._ahead.keys()]
            if not known:
                return
            i = min(known)
        ahead = list(self._ahead.values())
        count, nbytes = len(ahead), sum(s.nbytes for s in ahead)
        while True:
            if i in self._ahead:
                i += self._step
                continue
            slot = self._waiting.get(i)
            if slot is None:
                return
            if count and (count >= p.prefetch or nbytes + slot.nbytes > p.prefetch_bytes):
                return
            del self._waiting[i]
            self._issue(slot)
            self._ahead[i] = slot
            count, nbytes = count + 1, nbytes + slot.nbytes
            if self._recorder is not None:
                self._recorder.device_ahead(count, nbytes)
            i += self._step

    def _issue(self, slot: Slot) -> None:
        p = self.placement
        if p.cuda:
            slot.batch, slot.copy = _cuda_issue(slot.batch, p.device)
        elif p.framework == "jax":
            slot.batch, slot.copy = _jax_issue(slot.batch, p.device), True
        else:
            slot.batch, slot.copy = map_tensors(slot.batch, lambda t: t.to(p.device)), True

    def _hand_over(self, slot: Slot, late: bool) -> None:
        p, recorder = self.placement, self._recorder
        if p.cuda:
            reached = _cuda_hand_over(slot.batch, slot.copy, p.device)
            if recorder is not None:
                self._timings.append((slot.copy, reached))
                self._measure()
        if recorder is not None:
            recorder.copied(slot.nbytes, late)

    def _measure(self) -> None:
        """Record the copies whose events have completed (CUDA), oldest first."""
        assert self._recorder is not None
        while self._timings:
            measured = _cuda_elapsed(*self._timings[0])
            if measured is None:
                return
            self._timings.pop(0)
            self._recorder.copy_timed(*measured)


@dataclass(frozen=True)
class PlacedWork(BatchWork):
    """A worker's :class:`BatchWork` that stages its batches and registers them in the stream's
    :class:`DeviceQueue` (thread workers only: the queue lives in this process)."""

    queue: DeviceQueue | None = None

    def __call__(self, task: ReadTask) -> TaskResult:
        result = super().__call__(task)
        if self.queue is not None:
            result.batches = self.queue.register(task.batches, result.batches)
        return result


def check_placement(
    output: str,
    pin_memory: bool,
    device: Any,
    prefetch: int | None = None,
    prefetch_bytes: int | None = None,
) -> Placement | None:
    """Validate ``pin_memory``, ``device`` and the device prefetch bounds now; return the
    placement (or None: batches stay where the workers made them).

    >>> check_placement("numpy", pin_memory=False, device=None) is None
    True
    >>> check_placement("torch", False, "cpu", prefetch=4).prefetch
    4
    """
    for name, value in (("device_prefetch", prefetch), ("device_prefetch_bytes", prefetch_bytes)):
        if value is not None:
            check_int(name, value, minimum=0)
            if device is None:
                raise ValueError(
                    f"{name}={value} bounds the batches ahead on the device: it "
                    "needs device= (e.g. device='cuda')"
                )
    if not pin_memory and device is None:
        return None
    bounds = {
        "prefetch": DEFAULT_DEVICE_PREFETCH if prefetch is None else prefetch,
        "prefetch_bytes": DEFAULT_DEVICE_PREFETCH_BYTES
        if prefetch_bytes is None
        else prefetch_bytes,
    }
    if output == "jax" and not pin_memory:
        return Placement("jax", _jax_target(device), False, **bounds)
    if output != "torch":
        raise ValueError(
            f"pin_memory= and device= need output='torch' (got output={output!r}); device= "
            "also takes a jax.Device or jax.sharding.Sharding with output='jax'"
        )
    import torch

    target = torch.device(device) if device is not None else None
    cuda = torch.cuda.is_available()
    if target is not None and target.type == "cuda":
        if not cuda:
            raise ValueError(
                f"device={device!r} but this machine has no CUDA device (torch "
                f"{torch.__version__}); use device=None or 'cpu'"
            )
        if target.index is None:  # the training thread's device, not a worker's (ray#65059)
            target = torch.device("cuda", torch.cuda.current_device())
    if pin_memory and not cuda:
        warnings.warn(
            "pin_memory=True has no effect without CUDA; batches are not pinned",
            RuntimeWarning,
            stacklevel=3,
        )
        pin_memory = False
    if target is None and not pin_memory:
        return None
    return Placement("torch", target, pin_memory, **bounds)


def _jax_target(device: Any) -> Any:
    import jax

    if not isinstance(device, jax.Device | jax.sharding.Sharding):
        raise TypeError(
            f"with output='jax', device= takes a jax.Device (e.g. jax.devices()[0]) or a "
            f"jax.sharding.Sharding (e.g. NamedSharding(mesh, P('data'))), got {device!r}"
        )
    return device
