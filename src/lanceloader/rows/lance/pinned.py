"""The pinned dataset of Lance rows, opened in each process: lazily, once per process (keyed by
PID), never carried into a child (pickled, a ``Source`` is plain parameters: URI, version,
storage options, columns and the computed row list), refused in a process forked after Lance
ran (it would hang there: reads go through a clean reader instead); the per-process state
of reads on an object store (the fragments whose metadata this process has, the fragment
slivers its sequential reads share); and what is made of every fragment's metadata when first
needed, not at construction (the dataset identity, a cache unit's metadata: 20-30 ms over
2,000 fragments, ``rows/lance/fragments.py``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import lance

from lanceloader.lifecycle import forksafe
from lanceloader.rows.dataset import fragment_names, names_identity
from lanceloader.rows.lance.first_reads import FirstReads
from lanceloader.rows.lance.fragment_tails import FragmentTails
from lanceloader.rows.lance.fragments import Fragments
from lanceloader.rows.lance.units import Unit, UnitMetadata, unit_metadata
from lanceloader.rows.protocol import DatasetName
from lanceloader.rows.store import object_store_options

_MAKING = threading.Lock()  # one FragmentTails per Source and process, whichever thread asks


class PinnedDataset:
    """What a ``Source`` opens per process (see the module's text); it sets ``dataset_name``
    (a :class:`LateName`), ``storage_options``, ``_ds``, ``_pid``, ``_fragments``, ``_reader``, ``_units``,
    ``_first_reads`` and ``_tails``."""

    dataset_name: DatasetName
    storage_options: dict[str, str] | None
    _ds: lance.LanceDataset | None
    _pid: int
    _fragments: Fragments | None
    _units: list[Unit]
    cached: Any  # the reads through the cache (cached.py), or None
    _first_reads: FirstReads | None
    _tails: FragmentTails | None

    def __getstate__(self) -> dict[str, Any]:
        if self._ds is not None and self._pid == os.getpid() and not forksafe.tainted():
            self.settle()  # here, once: not in each process it goes to (a request each there)
        state = self.__dict__.copy()
        for live in ("_ds", "_fragments", "_reader", "_first_reads", "_tails", "_agree", "_names"):
            state[live] = None  # opened anew in each process (a followed table's agreement
            # and fragment names: used in the Loader's process only; the agreement may be a lambda)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def dataset(self) -> lance.LanceDataset:
        """The pinned dataset, opened in this process (reopened after fork, spawn or unpickling)."""
        if forksafe.tainted():
            raise RuntimeError(
                f"process {os.getpid()} was forked from a process that had already used Lance; "
                "Lance would hang or crash here. Read rows with Source.read()/read_table() (they "
                "go through a clean helper process), or start this process with 'forkserver' or "
                "'spawn'"
            )
        if self._ds is None or self._pid != os.getpid():
            # Opened into locals and published fragments first, the process id last: a thread
            # that reads concurrently (Grain calls from many threads) sees either nothing (and
            # opens its own: harmless) or a dataset with its fragments, never one without.
            name = self.dataset_name
            ds = lance.dataset(
                name.uri,
                version=name.version,
                storage_options=object_store_options(name.uri, self.storage_options),
            )
            self._fragments = Fragments(ds)
            self._first_reads = None  # a new dataset object: no file metadata cached yet
            self._ds = ds
            self._pid = os.getpid()
        return self._ds

    def settle(self) -> list[str | None]:
        """Make now, in this process, what is made when first needed, and return it: the
        dataset identity and the cache units' names (a process given a pickled copy then has
        them, and opens nothing to name a piece it finds in the cache)."""
        made: list[str | None] = [self.dataset_name.identity]
        return made if self.cached is None else made + self.cached.fragment_keys

    def unit_metadata(self, index: int) -> UnitMetadata:
        """What names the data of cache unit ``index`` (``rows/lance/units.py``), from its
        fragments' metadata, read in this process."""
        unit, fragments = self._units[index], self._opened_fragments()
        return unit_metadata([fragments.metadata(i) for i in range(unit.first, unit.stop)])

    def made_identity(self) -> str:
        """The dataset identity (:func:`~lanceloader.rows.dataset.dataset_identity`) of the
        pinned version, made from every fragment's metadata, read in this process."""
        names = fragment_names(self._opened_fragments().all_metadata())
        return names_identity(self.dataset.schema, names)

    def _opened_fragments(self) -> Fragments:
        """This process's :class:`Fragments` of the pinned version (opened with the dataset)."""
        fragments = self._fragments if self.dataset is not None else None
        assert fragments is not None  # the dataset sets them before it is published
        return fragments

    def _sharing(self) -> FragmentTails:
        """This process's :class:`FragmentTails` (made here after unpickling)."""
        tails = self._tails
        if tails is None:
            with _MAKING:
                tails = self._tails
                if tails is None:
                    tails = self._tails = FragmentTails()
        return tails

    def _opening(self) -> FirstReads:
        """This process's :class:`FirstReads` (made here after unpickling)."""
        first = self._first_reads
        if first is None:
            first = self._first_reads = FirstReads()
        return first


class LateName(DatasetName):
    """A Lance dataset's name whose identity is made when first read (a state, a cache key, a
    ledger), not at construction: by ``make``, a method of the rows that own it, in the
    process that reads it first (pickled once made, it carries the identity). Equal to and
    hashed as the :class:`DatasetName` it stands for."""

    # the maker in a slot: its __dict__ stays a DatasetName's plain data (identity None until made)
    __slots__ = ("_make",)
    _make: Callable[[], str]

    def __init__(
        self, uri: str, version: int, make: Callable[[], str], identity: str | None = None
    ) -> None:
        object.__setattr__(self, "uri", uri)
        object.__setattr__(self, "version", version)
        self.__dict__["identity"] = identity  # under the property: read and filled by it
        object.__setattr__(self, "_make", make)

    @property
    def identity(self) -> str:
        identity: str | None = self.__dict__["identity"]
        if identity is None:  # two threads making it make the same string
            identity = self.__dict__["identity"] = self._make()
        return identity

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DatasetName) and (self.uri, self.version, self.identity) == (
            other.uri,
            other.version,
            other.identity,
        )

    def __hash__(self) -> int:
        return hash((self.uri, self.version, self.identity))
