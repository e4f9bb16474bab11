"""A loader's one live iterator: held weakly (a ``break`` lets it be collected, which stops its
workers), the refusal of a second one (:class:`LoaderInUseError`), and the one warning for a
dropped one-batch peek (``next(iter(loader))``).

Example::

    >>> live = LiveIterator()
    >>> live.current() is None
    True
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lanceloader.engine.stream import EpochIterator, Handoff
    from lanceloader.state.cursor import Cursor

_logger = logging.getLogger("lanceloader")


class LoaderInUseError(RuntimeError):
    """``iter()`` (or ``set_epoch``/``load_state_dict``) while an iterator of the loader is live."""


def _no_iterator() -> None:
    return None


class LiveIterator:
    """A loader's one live :class:`EpochIterator`, held weakly: a ``break`` out of a ``for``
    loop lets it be collected, which stops its workers. Pickles empty (a running epoch belongs
    to its process).

    It keeps the last iterator's :class:`Handoff`, and when a new iterator continues an epoch
    that the last one left after a single batch taken with ``next()`` (``next(iter(loader))``
    to look at a sample), logs once per loader, at WARNING, that the batch was consumed and how
    many are left, with ``peek()`` as the way to look without consuming. A ``for`` loop that
    breaks (at any batch) and is resumed, an iterator stepped with ``next()`` more than once,
    and ``set_epoch``/``load_state_dict`` in between (:meth:`forget`) stay quiet.
    """

    def __init__(self) -> None:
        self._ref: Callable[[], EpochIterator | None] = _no_iterator
        self._last: Handoff | None = None
        self._warned = False

    def start(self, iterator: EpochIterator, cursor: Cursor) -> EpochIterator:
        """Hold ``iterator`` (weakly) as the live one; say once if the one before it was a
        dropped one-batch peek that this one continues after."""
        last, self._last = self._last, iterator.handoff
        if last is not None and not self._warned and last.dropped_one_peek(cursor):
            self._warned = True
            epoch_batches, left = len(cursor.spec.plan()), len(iterator)
            _logger.warning(
                "lanceloader: this iteration continues epoch %d with %d of its %d batches left: "
                "an earlier iterator of this loader handed batch %d to a next() call and was "
                "dropped, so that batch is consumed (next(iter(loader)) takes a batch from the "
                "epoch). To look at a batch without consuming it, use loader.peek(). (Said once "
                "per loader.)",
                cursor.epoch,
                left,
                epoch_batches,
                epoch_batches - left - 1,
            )
        self._ref = weakref.ref(iterator)
        return iterator

    def forget(self) -> None:
        """The cursor was moved on purpose (``set_epoch``, ``load_state_dict``): the last
        iterator's place no longer matters."""
        self._last = None

    def current(self) -> EpochIterator | None:
        """The iterator started last, while it exists (live or not)."""
        return self._ref()

    def check_idle(self, what: str, owner: Any, cursor: Cursor) -> None:
        """Raise :class:`LoaderInUseError` when an iterator is live, naming the ways out. A
        live iterator that handed out its epoch's last batch is not in the way: its epoch ends
        here (:meth:`EpochIterator.finish_if_delivered`)."""
        running = self._ref()
        if running is None or not running.live or running.finish_if_delivered():
            return
        raise LoaderInUseError(
            f"{what} on {owner!r} while an iterator of it is live: it is delivering epoch "
            f"{cursor.epoch}, {cursor.done} of {len(running.stream.plan)} batches so far. A "
            "loader has one live iterator at a time, so that no epoch ends silently. Ways out: "
            "loader.peek() looks at the next batch without consuming it; finish the first "
            "iterator, or call its close() (or loader.close()), and the next iter() continues "
            "that epoch where it stopped; or build a second Loader to read the data "
            "independently"
        )

    def close(self) -> None:
        running = self._ref()
        if running is not None:
            running.close()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
