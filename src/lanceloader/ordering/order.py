"""Order: which position of the source is global sample *i* of epoch *e*.

Everything here is a pure function of its arguments. Any slice of an epoch's order is computed
directly, without materialising the epoch: a shuffle is a keyed bijection (a Feistel network with
cycle walking), so shuffling 10**9 positions costs O(1) memory and the same (seed, epoch) gives the
same order on every process and machine.

Three modes, one class:

* sequential (``shuffle=False``): sample *i* is position *i*.
* full shuffle (``shuffle=True, block_size=1``): a uniform-looking random permutation.
* block shuffle (``block_size=k > 1``): blocks of *k* contiguous positions are permuted, then the
  rows of each *window* of ``window`` consecutive blocks are mixed. Reads stay contiguous (few I/O
  operations) while batches mix rows of ``window`` distant places in the dataset.

Example::

    >>> order = Order(num_rows=10, shuffle=True, seed=0)
    >>> sorted(order.positions(epoch=0, samples=np.arange(10)).tolist())
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

import numpy as np

_ROUNDS = 6
_ROUND_SALT = np.uint64(0xD6E8FEB86659FD93)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def derive_key(*parts: object) -> int:
    """A 64-bit key from any reprs, identical on every platform and Python version.

    >>> derive_key(0, "epoch", 1) == derive_key(0, "epoch", 1)
    True
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a fast, well-mixing bijection on uint64 arrays."""
    z = x.astype(np.uint64, copy=True)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def permute(indices: np.ndarray, n: int, key: int | np.ndarray) -> np.ndarray:
    """Map ``indices`` (values in ``[0, n)``) through a keyed pseudo-random permutation of ``[0, n)``.

    A Feistel network on the smallest power-of-two domain that holds ``n`` (halves of
    ``bits // 2`` and ``bits - bits // 2`` bits, alternating), with cycle walking: values that land
    outside ``[0, n)`` are encrypted again until they fall inside, which keeps the map a bijection
    on ``[0, n)``. The domain is below ``2n``, so walks are short (none when ``n`` is a power of
    two). ``key`` is one key, or one key per index (many independent permutations in one call).
    The round function is a multiply-xorshift-multiply hash: cheap in NumPy, well mixed.

    >>> permute(np.arange(5), 5, key=7).tolist() == permute(np.arange(5), 5, key=7).tolist()
    True
    """
    x = np.asarray(indices, dtype=np.uint64)
    if n <= 1:
        return x.astype(np.int64)
    bits = max(2, int(n - 1).bit_length())
    widths = (bits // 2, bits - bits // 2)  # (left, right); they swap every round
    round_keys = _round_keys(key, x.shape)

    def encrypt(v: np.ndarray, sel: np.ndarray | slice) -> np.ndarray:
        lw, rw = widths
        left, right = v >> np.uint64(rw), v & np.uint64((1 << rw) - 1)
        for k in round_keys:
            f = right + (k if k.ndim == 0 else k[sel])
            f *= GOLDEN
            f ^= f >> np.uint64(29)
            f *= GOLDEN
            f >>= np.uint64(64 - lw)  # lw bits: the width of the half it is xored into
            f ^= left
            left, right, lw, rw = right, f, rw, lw
        return (left << np.uint64(rw)) | right

    y = encrypt(x, slice(None))
    outside = np.flatnonzero(y >= np.uint64(n))
    while outside.size:
        y[outside] = encrypt(y[outside], outside)
        outside = outside[y[outside] >= np.uint64(n)]
    return y.astype(np.int64)


def _round_keys(key: int | np.ndarray, shape: tuple[int, ...]) -> list[np.ndarray]:
    """One key per round: scalars for one key, arrays for one key per index."""
    salts = np.arange(1, _ROUNDS + 1, dtype=np.uint64) * _ROUND_SALT
    if np.ndim(key) == 0:
        return list(mix64(np.uint64(int(key) & 0xFFFFFFFFFFFFFFFF) ^ salts))
    keys = np.asarray(key, dtype=np.uint64)
    if keys.size == 1:  # one key given as an array: the array formula, with scalar arithmetic
        return list(mix64(keys.reshape(1))[0] ^ salts)
    base = np.broadcast_to(mix64(keys), shape)
    return [base ^ salt for salt in salts]


DEFAULT_SHUFFLE_WINDOW = 8
# A block shuffle with blocks smaller than this reads rows at random, like a full shuffle.
RANDOM_BLOCK_ROWS = 64


@dataclass(frozen=True)
class Order:
    """The order of one epoch over ``num_rows`` source positions.

    ``block_size`` rows are read together; ``window`` blocks are mixed together. Both only matter
    when ``shuffle`` is true.

    >>> Order(num_rows=6).positions(epoch=0, samples=np.arange(6)).tolist()
    [0, 1, 2, 3, 4, 5]
    """

    num_rows: int
    shuffle: bool = False
    block_size: int = 1
    window: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_rows < 0:
            raise ValueError(f"num_rows must be >= 0, got {self.num_rows}")
        if self.block_size < 1:
            raise ValueError(
                f"shuffle_block_size must be >= 1, got {self.block_size}; use 1 for a full shuffle"
            )
        if self.window < 1:
            raise ValueError(f"shuffle_window must be >= 1 block, got {self.window}")

    @classmethod
    def from_options(
        cls,
        num_rows: int,
        shuffle: bool,
        shuffle_block_size: int,
        shuffle_window: int | None,
        seed: int,
    ) -> Order:
        """The order that the user-facing options name (``Loader``, the samplers): a block
        shuffle mixes :data:`DEFAULT_SHUFFLE_WINDOW` blocks unless ``shuffle_window`` says.

        >>> Order.from_options(100, True, 10, None, seed=0).window
        8
        """
        window = shuffle_window or (DEFAULT_SHUFFLE_WINDOW if shuffle_block_size > 1 else 1)
        return cls(num_rows, bool(shuffle), shuffle_block_size, window, seed)

    @property
    def random_reads(self) -> bool:
        """Whether this order reads rows at random (a full shuffle, or blocks under
        :data:`RANDOM_BLOCK_ROWS`): such takes cost more per call, so reads are sized smaller
        and ``stats()`` judges their speed as random reads."""
        return self.shuffle and self.block_size < RANDOM_BLOCK_ROWS

    @property
    def window_rows(self) -> int | None:
        """Samples per window of a block shuffle (a read of whole windows fetches whole blocks);
        ``None`` for the other orders, which have no windows."""
        return self.block_size * self.window if self.shuffle and self.block_size > 1 else None

    def positions(self, epoch: int, samples: np.ndarray) -> np.ndarray:
        """Source positions of the given global sample indices of ``epoch`` (int64 array)."""
        samples = np.asarray(samples, dtype=np.int64)
        if samples.size and (samples.min() < 0 or samples.max() >= self.num_rows):
            raise IndexError(f"sample indices must lie in [0, {self.num_rows})")
        if not self.shuffle or self.num_rows <= 1:
            return samples
        if self.block_size == 1:
            return permute(samples, self.num_rows, derive_key(self.seed, "rows", epoch))
        return self._block_positions(epoch, samples)

    def _block_positions(self, epoch: int, samples: np.ndarray) -> np.ndarray:
        # Full blocks are permuted; the short tail block (if any) stays last so that every window
        # but the last holds exactly window * block_size rows, which keeps the map O(1) per sample.
        if samples.size == 0:
            return samples
        k, n = self.block_size, self.num_rows
        full_blocks = n // k
        window_rows = self.window * k
        last_window = (n - 1) // window_rows
        win = samples // window_rows
        within = samples % window_rows
        window_keys = mix64(
            win.astype(np.uint64) ^ np.uint64(derive_key(self.seed, "window", epoch))
        )
        sizes = np.where(win < last_window, window_rows, n - last_window * window_rows)
        mixed = np.empty_like(within)
        runs = np.flatnonzero(np.diff(win)) + 1  # a read's samples are runs of whole windows
        if len(runs) < 64:
            for lo, hi in itertools.pairwise([0, *runs.tolist(), len(win)]):
                # One window per run: scalar keys, same permutation as the per-sample path.
                mixed[lo:hi] = permute(within[lo:hi], int(sizes[lo]), window_keys[lo : lo + 1])
        else:
            for size in np.unique(sizes).tolist():
                sel = sizes == size
                mixed[sel] = permute(within[sel], size, window_keys[sel])
        block = win * self.window + mixed // k
        phys = block.copy()
        is_full = block < full_blocks
        phys[is_full] = _permute_blocks(
            block[is_full], full_blocks, derive_key(self.seed, "blocks", epoch)
        )
        return phys * k + mixed % k


def _permute_blocks(blocks: np.ndarray, n: int, key: int) -> np.ndarray:
    """``permute`` of block numbers, which repeat (``block_size`` rows each) and, in one read,
    span a short range: permute that range once and look the rows' blocks up in it."""
    if blocks.size == 0:
        return blocks
    lo, hi = int(blocks.min()), int(blocks.max())
    if hi - lo + 1 > blocks.size // 8:
        return permute(blocks, n, key)
    table = permute(np.arange(lo, hi + 1), n, key)
    return table[blocks - lo]
