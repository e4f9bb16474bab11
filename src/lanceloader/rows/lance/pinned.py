"""The pinned dataset of Lance rows, opened in each process: lazily, once per process (keyed by
PID), never carried into a child (pickled, a ``Source`` is plain parameters: URI, version,
storage options, columns and the computed row list), refused in a process forked after Lance
ran (it would hang there: reads go through a clean reader instead); and the per-process state
of reads on an object store (the fragments whose metadata this process has, the fragment
slivers its sequential reads share)."""

from __future__ import annotations

import os
import threading
from typing import Any

import lance

from lanceloader.lifecycle import forksafe
from lanceloader.rows.lance.first_reads import FirstReads
from lanceloader.rows.lance.fragment_tails import FragmentTails
from lanceloader.rows.protocol import DatasetName
from lanceloader.rows.store import object_store_options

_MAKING = threading.Lock()  # one FragmentTails per Source and process, whichever thread asks


class PinnedDataset:
    """What a ``Source`` opens per process (see the module's text); it sets ``dataset_name``,
    ``storage_options``, ``_ds``, ``_pid``, ``_fragments``, ``_reader``,
    ``_first_reads`` and ``_tails``."""

    dataset_name: DatasetName
    storage_options: dict[str, str] | None
    _ds: lance.LanceDataset | None
    _pid: int
    _fragments: Any
    _first_reads: FirstReads | None
    _tails: FragmentTails | None

    def __getstate__(self) -> dict[str, Any]:
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
            ds = lance.dataset(
                self.dataset_name.uri,
                version=self.dataset_name.version,
                storage_options=object_store_options(self.dataset_name.uri, self.storage_options),
            )
            self._fragments = ds.get_fragments()
            self._first_reads = None  # a new dataset object: no file metadata cached yet
            self._ds = ds
            self._pid = os.getpid()
        return self._ds

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
