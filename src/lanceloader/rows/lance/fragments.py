"""The pinned version's fragments, from one call into Lance, wrapped and described on demand.

A table grown by appends has thousands of fragments (2,000 per million rows appended 500 at a
time). What a Source needs of every fragment at construction is its id and its rows after
deletions (the plan), which Lance's own fragment objects give for about 2 us each. The rest is
asked of a few fragments only, or later: the Python ``LanceFragment`` wrapper (a read, the size
sample; about 1 us each, made when first asked for) and each fragment's metadata (its data file
names: what the dataset identity and the cache's piece names hash; 5-9 us each, read when first
needed). ``Source(...)`` over 2,000 fragments paid 25-35 ms of this per-fragment Python work
(``benchmarks/fragments.py``).

Contract: one :class:`Fragments` per opened dataset and process (it holds live Lance objects and
is never pickled: ``pinned.py`` makes it anew with each dataset it opens). Indices are positions
in the pinned version's fragment list. Threads may ask concurrently: a slot filled twice holds
equal objects, so no lock.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import lance
import numpy as np
from lance.fragment import LanceFragment


class Fragments(Sequence[LanceFragment]):
    """The fragments of ``ds`` (see the module's text): ``fragments[i]`` is a ``LanceFragment``,
    a slice a list of them; :meth:`ids`, :meth:`live_rows` and :meth:`metadata` read the
    manifest Lance already holds."""

    def __init__(self, ds: lance.LanceDataset) -> None:
        self._ds = ds
        self._raw: list[Any] = ds._ds.get_fragments()  # Lance's own, no wrapper each
        self._wrapped: list[LanceFragment | None] = [None] * len(self._raw)
        self._metadata: list[Any] = [None] * len(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    @overload
    def __getitem__(self, index: int) -> LanceFragment: ...

    @overload
    def __getitem__(self, index: slice) -> list[LanceFragment]: ...

    def __getitem__(self, index: int | slice) -> LanceFragment | list[LanceFragment]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._raw)))]
        fragment = self._wrapped[index]
        if fragment is None:
            fragment = self._wrapped[index] = LanceFragment(
                self._ds, None, fragment=self._raw[index]
            )
        return fragment

    def __iter__(self) -> Iterator[LanceFragment]:
        return (self[i] for i in range(len(self._raw)))

    def ids(self) -> list[int]:
        """Each fragment's id, in order."""
        return [f.id() for f in self._raw]

    def live_rows(self) -> np.ndarray:
        """Each fragment's rows after deletions, from the manifest: physical rows less those
        deleted, no per-fragment I/O (``count_rows()`` cost 10-20 ms over 2,000 fragments). A
        fragment with a deletion file asks Lance for its count (recorded in the manifest, or
        read from the file where an old Lance did not record it)."""
        return np.fromiter(
            (
                raw.physical_rows - (0 if raw.deletion_file() is None else raw.num_deletions)
                for raw in self._raw
            ),
            dtype=np.int64,
            count=len(self._raw),
        )

    def metadata(self, index: int) -> Any:
        """Fragment ``index``'s ``FragmentMetadata`` (ids, data files, deletion file), read from
        Lance once."""
        meta = self._metadata[index]
        if meta is None:
            meta = self._metadata[index] = self._raw[index].metadata()
        return meta

    def all_metadata(self) -> list[Any]:
        """Every fragment's :meth:`metadata`, in order."""
        return [self.metadata(i) for i in range(len(self._raw))]
