"""A file of which only some byte ranges are present: what a clip is decoded from.

``SparseFile(parts, size)`` reads the parts and zeros in the gaps (FFmpeg reads forward through
short gaps instead of seeking); a decoder calls ``require`` on every byte it uses first, which
raises ``MissingBytes`` for a byte not given, so a missing byte is asked for, never decoded as
a zero. Pure Python, no PyAV; :mod:`lanceloader.media.video` uses it (both names are importable
there too).

Example:
    >>> file = SparseFile([(0, b"abc")], size=6)
    >>> file.read(), file.read(), file.read()
    (b'abc', b'\\x00\\x00\\x00', b'')
"""

from __future__ import annotations

import bisect
import io
from typing import Any


class MissingBytes(Exception):
    """A decode needed bytes ``[offset, offset + length)`` that are not in its parts.

    Read them (``clip_byte_ranges`` lists what a clip needs; a video whose index does not match
    the file can need more) and call again with them added.

    Example:
        >>> MissingBytes(100, 20)
        MissingBytes(offset=100, length=20)
    """

    def __init__(self, offset: int, length: int) -> None:
        super().__init__(offset, length)
        self.offset, self.length = offset, length

    def __str__(self) -> str:
        return (
            f"bytes [{self.offset}, {self.offset + self.length}) of the video are not in the "
            "parts given: read them and decode again with them added"
        )

    def __repr__(self) -> str:
        return f"MissingBytes(offset={self.offset}, length={self.length})"


class SparseFile(io.RawIOBase):
    r"""A read-only, seekable file of ``size`` bytes of which only ``parts`` are present.

    Reads never fail: a gap reads as zeros. That is on purpose: FFmpeg's reader, asked to seek less
    than ~32 KiB ahead, reads forward through the bytes instead, so it reads gaps it then skips.
    What a decoder *uses* is checked with ``require`` first, which raises ``MissingBytes`` for any
    byte not present: so a missing byte is asked for, never decoded as a zero.

    Example:
        >>> file = SparseFile([(0, b"abc"), (10, b"xyz")], size=20)
        >>> file.read(5), file.read(2), file.seek(11), file.read(8)
        (b'abc', b'\x00\x00', 11, b'yz')
        >>> file.require(0, 3)
        >>> file.require(2, 10)
        Traceback (most recent call last):
        ...
        lanceloader.media.sparse.MissingBytes: bytes [3, 10) of the video are not in the parts given: read them and decode again with them added
    """

    def __init__(self, parts: list[tuple[int, bytes]], size: int) -> None:
        super().__init__()
        self._parts = sorted((int(offset), bytes(data)) for offset, data in parts)
        for (offset, data), (after, _) in zip(self._parts, self._parts[1:], strict=False):
            if offset + len(data) > after:
                raise ValueError(
                    f"parts at bytes {offset} and {after} overlap: pass disjoint parts"
                )
        if self._parts and self._parts[-1][0] + len(self._parts[-1][1]) > size:
            raise ValueError(f"a part runs past size={size}: pass the file's size in bytes")
        self._starts = [offset for offset, _ in self._parts]
        self.size, self._position = size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.size}[whence]
        self._position = max(base + offset, 0)
        return self._position

    def _part_at(self, position: int) -> tuple[int, int]:
        """(start, end) of the part holding ``position``, or of the gap there (start < 0)."""
        index = bisect.bisect_right(self._starts, position) - 1
        if index >= 0 and position < self._starts[index] + len(self._parts[index][1]):
            return self._starts[index], self._starts[index] + len(self._parts[index][1])
        following = self._starts[index + 1] if index + 1 < len(self._starts) else self.size
        return -1, following

    def read(self, n: int = -1) -> bytes:
        position = self._position
        if position >= self.size:
            return b""
        n = self.size - position if n is None or n < 0 else min(n, self.size - position)
        start, end = self._part_at(position)
        if start < 0:
            chunk = bytes(min(n, end - position))
        else:
            data = self._parts[bisect.bisect_right(self._starts, position) - 1][1]
            chunk = data[position - start : position - start + n]
        self._position += len(chunk)
        return chunk

    def readinto(self, buffer: Any) -> int:
        chunk = self.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)

    def require(self, offset: int, length: int) -> None:
        """Raise ``MissingBytes`` for the first missing run of bytes in ``[offset, offset + length)``."""
        position, end = offset, min(offset + length, self.size)
        while position < end:
            start, stop = self._part_at(position)
            if start < 0:
                raise MissingBytes(position, min(stop, end) - position)
            position = stop
