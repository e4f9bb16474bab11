"""Following a growing Lance table: each epoch reads the newest version at the epoch's start.

With ``Loader(uri, follow=True)`` the rows of an epoch are one version of the table, pinned for
the whole epoch as without following; when an epoch starts at its sample 0 (its first
``iter()`` or ``peek()``), the loader looks for a newer version and, if there is one, adopts it:
that epoch's order is a new plan over the new version's rows (``ordering/order.py``: a pure
function of seed, epoch and row count). So rows delivered in an epoch are never delivered again
in it, and rows appended during epoch ``e`` are delivered in epoch ``e + 1``.

What the state records (``state["order"]["follow"]``, :class:`Following`): the last epoch
whose start looked (``checked``) and the adoptions, ``[epoch, version, rows, change]`` each
(about 30 bytes). The state's own ``version`` and ``dataset`` are the current epoch's. A resume
reads the state's version again, whatever the table's newest is now, and looks for a newer one
only at the next epoch's start: the same rows in the same order as the uninterrupted run that
adopted the same versions at the same epochs, on any number of ranks.

What a new version is (:func:`change_between`, from the manifests' fragment metadata alone,
no data read): ``"append"`` (every fragment of the old version unchanged and in place, new
ones after it), ``"columns"`` (the same rows at the same offsets, data files added or replaced:
``add_columns``, a column rewritten in place) or ``"rewrite"`` (rows deleted, fragments
compacted or updated, the table overwritten). All are adopted at an epoch start with a new plan
over the new rows (deleted rows are gone from it; anything but an append is logged at WARNING
naming what changed). Refused, with the fix:
a rewrite under named splits keyed by row offset (offsets shift, rows would change splits),
and a version whose projected columns changed type or vanished.

Several ranks must read the same version, and each looks at its own moment (an append can land
between two looks), so they agree (:func:`agreement`): rank 0's version through
``torch.distributed``, or the user's ``agree(newest) -> version``, called on every rank at the
Loader's construction and at each epoch start that looks (in ``iter()``; a ``peek()`` there is
refused, :func:`refuse_pending_look`). Who calls what: the Loader's process alone looks, adopts
and agrees; workers get the adopted rows pickled, without the agreement.

Example::

    >>> import pyarrow as pa, tempfile
    >>> from lanceloader import Loader
    >>> uri = tempfile.mkdtemp() + "/t.lance"
    >>> _ = lance.write_dataset(pa.table({"id": range(8)}), uri)
    >>> loader = Loader(uri, batch_size=4, follow=True, num_workers=1)
    >>> _ = lance.write_dataset(pa.table({"id": [8, 9]}), uri, mode="append")
    >>> [len(list(loader)) for _ in range(2)]                        # 8 rows, then 10
    [2, 3]
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import lance

from lanceloader.arguments import check_bool
from lanceloader.rows.dataset import fragment_names
from lanceloader.state.format import StateMismatchError

if TYPE_CHECKING:
    import pyarrow as pa
    from typing_extensions import Self

FOLLOW = "follow"  # the key of the following history in state["order"]
Name = tuple[Any, ...]  # a fragment's id, physical rows, data files and deletion file
# agree(newest version this rank sees) -> the version every rank adopts (the same on each)
Agreement = Callable[[int], int]
CHANGES = ("start", "append", "columns", "rewrite")
_logger = logging.getLogger("lanceloader")


class FollowedRows(Protocol):
    """What following needs of the rows it is mixed into (a Lance ``Source``): declared here,
    so that this module needs nothing from ``source.py``."""

    follow: Following | None
    _agree: Agreement | None
    _given: dict[str, Any]

    @property
    def uri(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def num_rows(self) -> int: ...
    @property
    def dataset(self) -> lance.LanceDataset: ...
    @property
    def splits(self) -> dict[str, float] | None: ...
    @property
    def split_key(self) -> str | None: ...
    def schema_table(self) -> pa.Table: ...
    def fragment_names(self) -> list[Name]: ...
    def at_version(self, version: int) -> Self: ...
    def following(self, history: Following | None) -> Self: ...


R = TypeVar("R", bound=FollowedRows)


@dataclass(frozen=True)
class Adoption:
    """Epoch ``epoch`` was the first to read ``version`` (``rows`` rows after filter and split),
    which was a ``change`` of the version before: ``"start"`` (the version the loader was built
    on), ``"append"``, ``"columns"`` (data files added or replaced, every row at its offset:
    ``add_columns``, a column rewritten in place; maybe with appends) or ``"rewrite"``."""

    epoch: int
    version: int
    rows: int
    change: str


@dataclass(frozen=True)
class Following:
    """A followed table's history: the last epoch whose start looked for a newer version, and
    the adoptions in run order (the last one's version is the current epoch's).

    >>> f = Following.starting(version=3, rows=100).adopted(2, 5, 120, "append")
    >>> f.settings()
    {'checked': 2, 'adoptions': [[0, 3, 100, 'start'], [2, 5, 120, 'append']]}
    """

    checked: int
    adoptions: tuple[Adoption, ...]

    @classmethod
    def starting(cls, version: int, rows: int) -> Following:
        """The history of a loader built on ``version``: epoch 0's start has looked."""
        return cls(0, (Adoption(0, version, rows, "start"),))

    def looked(self, epoch: int) -> Following:
        """Epoch ``epoch``'s start looked and found no newer version."""
        return Following(max(self.checked, epoch), self.adoptions)

    def adopted(self, epoch: int, version: int, rows: int, change: str) -> Following:
        """Epoch ``epoch``'s start adopted ``version``."""
        return Following(epoch, (*self.adoptions, Adoption(epoch, version, rows, change)))

    def version_in(self, epoch: int) -> int:
        """The version an epoch up to the last one looked at read (the first epoch's for one
        before it: a loader built at a later epoch)."""
        read = [a.version for a in self.adoptions if a.epoch <= epoch]
        return read[-1] if read else self.adoptions[0].version

    def settings(self) -> dict[str, Any]:
        """The JSON-safe section of ``state["order"]`` (in the fingerprint)."""
        return {
            "checked": self.checked,
            "adoptions": [[a.epoch, a.version, a.rows, a.change] for a in self.adoptions],
        }

    @classmethod
    def of_settings(cls, section: Any) -> Following:
        """The history a state's ``order["follow"]`` section holds, checked (a damaged one
        raises :class:`StateMismatchError` naming it)."""
        where = "state['order']['follow']"
        try:
            checked, rows = section["checked"], section["adoptions"]
            adoptions = tuple(Adoption(*a) for a in rows)
        except (TypeError, KeyError, IndexError) as exc:
            raise StateMismatchError(
                f"{where} must be {{'checked': epoch, 'adoptions': [[epoch, version, rows, "
                f"change], ...]}}, got {section!r}: the state was edited or damaged"
            ) from exc
        numbers = [checked] + [n for a in adoptions for n in (a.epoch, a.version, a.rows)]
        epochs = [a.epoch for a in adoptions]
        if (
            not adoptions
            or not all(type(n) is int and n >= 0 for n in numbers)
            or any(a.change not in CHANGES for a in adoptions)
            or epochs != sorted(set(epochs))
            or epochs[-1] > checked
        ):
            raise StateMismatchError(
                f"{where} = {section!r} is not a history of adoptions (epochs ascending, "
                f"each change one of {CHANGES}, none after 'checked'): the state was edited "
                "or damaged"
            )
        return cls(checked, adoptions)


@dataclass(frozen=True)
class Change:
    """What a new version is of an old one: ``kind`` is ``"same"`` (the same data: a version
    that changed only indices, tags or settings), ``"append"``, ``"columns"`` (the same rows at
    the same offsets, data files added or replaced) or ``"rewrite"``; ``detail`` names what
    changed."""

    kind: str
    detail: str


def change_between(before: list[Name], after: list[Name]) -> Change:
    """Whether the fragments ``after`` (a version's :func:`fragment_names`) are those
    ``before`` unchanged and in place, then others (an append: every old row keeps its
    offset), and if not, what changed: fragments gone (compaction, a delete of whole fragments,
    an overwrite), rewritten (an update, compaction), or with rows deleted."""
    if before == after:
        return Change("same", "the same fragments")
    added = sum(n[1] for n in after[len(before) :])
    appended = f"{len(after) - len(before)} fragments of {added} rows appended"
    if after[: len(before)] == before:
        return Change("append", appended)
    if [_rows_of(n) for n in after[: len(before)]] == [_rows_of(n) for n in before]:
        changed = [a[0] for a, b in zip(before, after, strict=False) if a != b]
        return Change(
            "columns",
            f"data files of fragments {_ids(changed)} added or replaced (columns added or "
            f"rewritten in place: every row keeps its offset); {appended}",
        )
    now = {n[0]: n for n in after}
    gone = [n[0] for n in before if n[0] not in now]
    kept = [(n, now[n[0]]) for n in before if n[0] in now]
    rewritten = [was[0] for was, is_ in kept if was[:3] != is_[:3]]
    deleted = [was[0] for was, is_ in kept if was[:3] == is_[:3] and was[3] != is_[3]]
    parts = [
        f"{what} {_ids(ids)}"
        for what, ids in (
            ("fragments gone (compaction, deletes or an overwrite):", gone),
            ("fragments rewritten (an update or compaction):", rewritten),
            ("rows deleted in fragments", deleted),
        )
        if ids
    ]
    return Change("rewrite", "; ".join(parts) or "the fragments were reordered")


def _rows_of(name: Name) -> Name:
    """A fragment's rows without its files: id, physical rows, deletion file."""
    return name[0], name[1], name[3]


def _ids(ids: list[Any], limit: int = 6) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return f"[{shown}{', ...' if len(ids) > limit else ''}] ({len(ids)})"


def at_epoch_start(source: R, epoch: int) -> R:
    """The rows epoch ``epoch`` reads, asked as it starts at sample 0: when that epoch's start
    has looked already (a resume, ``set_epoch`` back), the version the history says it read;
    else the table's newest version (``source`` with the look recorded when none is newer)."""
    follow = source.follow
    if follow is None:
        return source
    if epoch <= follow.checked:
        read = follow.version_in(epoch)
        return source if read == source.version else source.at_version(read).following(follow)
    # the newest version's number, from the version list (no manifest read: ~1 ms where opening
    # the newest version of a 10,000-fragment table read its manifest in ~50 ms)
    version = agreed_version(source.dataset.latest_version, source._agree)
    if version == source.version:
        return source.following(follow.looked(epoch))
    adopted = source.at_version(version)
    change = change_between(source.fragment_names(), adopted.fragment_names())
    refuse_change(source, version, change)
    refuse_new_columns(source, adopted)
    kind = "append" if change.kind == "same" else change.kind
    log = _logger.info if kind == "append" else _logger.warning
    log(
        "lanceloader: epoch %d reads version %d of %r (%d rows; version %d had %d): %s%s",
        epoch,
        adopted.version,
        source.uri,
        adopted.num_rows,
        source.version,
        source.num_rows,
        change.detail,
        ": a new plan over the new version's rows" if kind == "rewrite" else "",
    )
    return adopted.following(follow.adopted(epoch, adopted.version, adopted.num_rows, kind))


def refuse_change(source: FollowedRows, version: int, change: Change) -> None:
    """A rewrite under splits keyed by row offset would move rows between splits: refused."""
    if change.kind == "rewrite" and source.splits and source.split_key is None:
        raise ValueError(
            f"follow=True: version {version} of {source.uri!r} is not an append of version "
            f"{source.version} ({change.detail}), and the splits {source.splits} are keyed by "
            "row offset, which a delete or compaction shifts: rows would move between splits "
            "(a validation row could reach training). Key the splits by a column "
            "(split_key='id'), or pin the version (follow=False)"
        )


def refuse_new_columns(old: FollowedRows, new: FollowedRows) -> None:
    """The projected columns must keep their types: the output checks were made on them."""
    before, after = old.schema_table().schema, new.schema_table().schema
    if not before.equals(after):
        raise ValueError(
            f"follow=True: version {new.version} of {old.uri!r} changed the columns read "
            f"({before.names} as {[str(t) for t in before.types]} in version {old.version}, "
            f"{[str(t) for t in after.types]} now): the batches would change shape mid-run. "
            "Pin the version (follow=False) or build a new Loader for the new schema"
        )


def resumed_following(source: R, state: dict[str, Any]) -> R:
    """The rows that continue ``state`` of a followed table: the state's version (not the
    table's newest), with the state's history. A state without a history (a pinned loader's)
    leaves ``source`` as it is: the order check then names the difference."""
    section = state["order"].get(FOLLOW)
    if section is None:
        return source
    history = Following.of_settings(section)
    version = state["version"]
    if version == source.version:
        return source.following(history)
    try:
        rows = source.at_version(version)
    except ValueError as exc:
        raise StateMismatchError(
            f"the state's epoch {state['epoch']} reads version {version} of {source.uri!r} "
            f"(follow=True adopted it at epoch {history.adoptions[-1].epoch}), which cannot be "
            f"read now ({exc}). Keep the versions a run may resume from (Lance's "
            "cleanup_old_versions removes them; tag one with ds.tags.create), or resume from "
            "a state saved at a later epoch"
        ) from exc
    return rows.following(history)


def with_history(source: R, history: Following | None) -> R:
    """``source`` (the same version's rows, sharing its dataset, cache and plan) with
    ``history``: a shallow copy (``copy.copy`` would drop the live dataset, as pickling does)."""
    twin = copy.copy(source.__dict__)
    rows = object.__new__(type(source))
    rows.__dict__.update(twin)
    rows.follow = history
    return rows


class FollowsTable:
    """What a :class:`~lanceloader.rows.lance.source.Source` does with ``follow=True`` (see the
    module's text), mixed into it; the Source sets ``follow`` (``None`` when pinned) and
    ``_given`` (the settings :meth:`at_version` builds another version's rows with)."""

    follow: Following | None
    _given: dict[str, Any]
    _agree: Agreement | None
    _names: list[Name] | None  # the fragments' names, made at construction when following

    def follow_settings(self) -> dict[str, Any]:
        """``{"follow": history}`` for the rows' settings, or nothing when pinned."""
        return {} if self.follow is None else {FOLLOW: self.follow.settings()}

    def fragment_names(self) -> list[Name]:
        """This version's :func:`fragment_names` (kept from construction when following)."""
        if self._names is None:
            metadata = [f.metadata for f in cast("FollowedRows", self).dataset.get_fragments()]
            self._names = fragment_names(metadata)
        return self._names

    def at_epoch_start(self: R, epoch: int) -> R:
        """The rows epoch ``epoch`` reads, asked as it starts at sample 0: these, or with
        ``follow=True`` the table's newest version (:func:`at_epoch_start`)."""
        return at_epoch_start(self, epoch)

    def resumed(self: R, state: dict[str, Any], allow_changes: tuple[str, ...]) -> tuple[R, int]:
        """These rows continue any state of them; a followed table's, at the state's version
        with its history (:func:`resumed_following`)."""
        if self.follow is None:
            return self, state["sample"]
        return resumed_following(self, state), state["sample"]

    def at_version(self: R, version: int) -> R:
        """These settings' rows of ``version`` of the same table, following with the same
        agreement (its history starts there: see :meth:`following`)."""
        rows: Any = self  # a Source: its constructor and settings
        return type(rows)(
            rows.uri,
            rows.columns,
            rows.filter,
            version,
            rows.storage_options,
            rows.splits,
            rows.split,
            rows.split_key,
            blobs=rows.blobs,
            follow=self._agree or True,
            **self._given,
        )

    def following(self: R, history: Following | None) -> R:
        """These rows with the following ``history`` (a copy sharing the dataset and cache)."""
        return with_history(self, history)


def refuse_following(rows: Any, what: str) -> None:
    """``what`` (an adapter with a cursor of its own) keeps epochs of one size: refuse rows that
    follow a table."""
    if FOLLOW in rows.settings():
        raise ValueError(
            f"{what} plans its epochs over the rows it was built with, and its Loader follows "
            "its table (follow=True), whose epochs change size: iterate the Loader itself "
            "(for batch in loader), or pin the version (follow=False)"
        )


def start_following(
    follow: bool | Agreement, version: int, rows: int, names: list[Name]
) -> tuple[Following | None, Agreement | None, list[Name] | None]:
    """A Source's history, agreement and fragment names (what the next version is compared
    with) for its ``follow`` argument: ``False`` (pinned), ``True`` (the newest version this
    process sees) or an agreement function."""
    if not callable(follow):
        check_bool("follow", follow)
    if not follow:
        return None, None, None
    agree = follow if callable(follow) else None
    return Following.starting(version, rows), agree, names


def agreed_dataset(
    ds: lance.LanceDataset, follow: bool | Agreement | None, version: int | str | None
) -> lance.LanceDataset:
    """``ds`` (the newest version this rank sees, unless ``version`` was given), or the version
    ``follow(ds.version)`` agrees on, the same on every rank."""
    if not callable(follow) or version is not None:
        return ds
    agreed = agreed_version(ds.version, follow)
    return ds if agreed == ds.version else ds.checkout_version(agreed)


def agreed_version(newest: int, agree: Agreement | None) -> int:
    """The version every rank reads: ``agree(newest)``, or ``newest`` with no agreement."""
    if agree is None:
        return newest
    agreed = agree(newest)
    if isinstance(agreed, bool) or not isinstance(agreed, int):
        raise TypeError(
            f"follow={agree!r} returned {agreed!r}: an agreement returns the version (an int) "
            "every rank reads, e.g. rank 0's newest"
        )
    return agreed


def agreement(follow: bool | Agreement, world_size: int) -> bool | Agreement:
    """What ``Loader(follow=...)`` gives its rows: on several ranks, the ranks must read the same
    version each epoch, and each sees the table at its own moment; so ``follow=True`` there
    takes rank 0's version through ``torch.distributed`` (a broadcast at the Loader's
    construction and at each epoch start), or is refused, naming the fix."""
    if callable(follow) or follow is False or world_size == 1:
        return follow
    check_bool("follow", follow)
    torch = sys.modules.get("torch")
    if (
        torch is not None
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
    ):
        return rank0_version
    raise ValueError(
        f"follow=True on {world_size} ranks: every rank must read the same version each epoch, "
        "and each sees the table at its own moment (an append can land between two ranks' "
        "looks). Initialise torch.distributed before building the Loader (rank 0's version is "
        "then broadcast), or pass follow=agree, a function agree(newest) -> version that "
        "returns the same version on every rank (e.g. rank 0's, broadcast by your framework)"
    )


def rank0_version(newest: int) -> int:
    """Rank 0's newest version, on every rank (``torch.distributed``'s default group)."""
    import torch.distributed as dist

    box = [newest]
    dist.broadcast_object_list(box, src=0)
    return int(box[0])


def refuse_pending_look(rows: Any, epoch: int) -> None:
    """``peek()`` on one of several ranks at the start of an epoch that has not yet looked for a
    newer version: the ranks agree on it together in ``iter()``, so a peek cannot know it."""
    section = rows.settings().get(FOLLOW)
    if section is not None and section["checked"] < epoch:
        raise ValueError(
            f"peek() at the start of epoch {epoch} of a followed table (follow=True) on "
            "several ranks: the ranks agree on the version the epoch reads in iter(), all at "
            "once, so the next batch is not known yet. Call peek() after iter() started the "
            "epoch"
        )


def refuse_unagreed(rows: Any, world_size: int) -> None:
    """Rows given to a Loader of several ranks as a ``Source(follow=True)`` without an
    agreement: each rank would adopt the version it sees. Refused, naming the fix."""
    if world_size > 1 and FOLLOW in rows.settings() and getattr(rows, "_agree", 1) is None:
        raise ValueError(
            f"a Source(follow=True) given to a Loader of {world_size} ranks: every rank must "
            "read the same version each epoch. Pass follow=agree to the Source, a function "
            "agree(newest) -> version returning the same version on every rank, or build "
            "Loader(uri, follow=True) (rank 0's version through torch.distributed)"
        )
