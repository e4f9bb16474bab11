"""Every rank's wait for data, gathered over gloo, and the slowest rank named.

In a synchronous step every rank waits for the slowest; :func:`across_ranks` finds it from each
rank's own stats (a collective: every rank calls it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lanceloader.engine.stats import Stats
from lanceloader.integrations.metrics.scalars import Totals, window


@dataclass(frozen=True)
class RankWait:
    """One rank's wait for data, over a window (see :func:`across_ranks`)."""

    rank: int
    batches: int
    wall_s: float
    wait_s: float
    wait_p50_s: float | None
    wait_p95_s: float | None
    wait_p99_s: float | None

    @property
    def wait_share(self) -> float:
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class RankWaits:
    """Every rank's :class:`RankWait`, in rank order; ``slowest`` waited longest for data (in a
    synchronous step, the rank the others wait for)."""

    ranks: tuple[RankWait, ...]

    @property
    def slowest(self) -> RankWait:
        return max(self.ranks, key=lambda r: (r.wait_s, r.wait_p99_s or 0.0, -r.rank))


_gloo_groups: dict[int, Any] = {}


def across_ranks(stats: Any, since: Stats | None = None, group: Any = None) -> RankWaits:
    """Gather every rank's wait per batch (``stats``: a loader or its ``stats()``; ``since``:
    an earlier ``stats()``, for a window) and return them all, with the slowest.

    A collective: every rank of the group must call it. Without an initialized
    ``torch.distributed`` process group it returns this process alone. The gather runs on a
    gloo group (CPU, whatever the training's backend): ``group`` if given, else the default
    group when it is gloo, else one gloo group made once over all ranks (``new_group``, also
    a collective).
    """
    if callable(getattr(stats, "stats", None)):
        stats = stats.stats()
    if not isinstance(stats, Stats | Totals):
        raise TypeError(
            f"across_ranks: expected a lanceloader Loader (anything with stats()) or its "
            f"stats(), got {type(stats).__name__!r}"
        )
    w = window(stats, since)
    rank = 0
    dist = _distributed()
    if dist is not None:
        rank = dist.get_rank()
    mine = RankWait(
        rank,
        int(w["batches"]),
        w["wall_s"],
        w["wait_s"],
        w["wait_p50_s"],
        w["wait_p95_s"],
        w["wait_p99_s"],
    )
    if dist is None:
        return RankWaits((mine,))
    group = group if group is not None else _gloo_group(dist)
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, asdict(mine), group=group)
    return RankWaits(tuple(sorted((RankWait(**g) for g in gathered), key=lambda r: r.rank)))


def _distributed() -> Any:
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def _world() -> int:
    dist = _distributed()
    return dist.get_world_size() if dist is not None else 1


def _gloo_group(dist: Any) -> Any:
    if dist.get_backend() == "gloo":
        return None  # the default group
    key = id(dist.group.WORLD)  # one gloo group per default group
    if key not in _gloo_groups:
        _gloo_groups[key] = dist.new_group(backend="gloo")
