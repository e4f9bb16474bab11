"""Images checked before :func:`lanceloader.convert` stores them: whole, and not damaged.

:func:`checked_image` is what ``convert(check_images=...)`` runs on each file's bytes, in the
conversion's reading threads: ``"structure"`` (the default) walks JPEG and PNG files through to
their end without decoding the pixels, ``"decode"`` decodes them, ``"none"`` trusts them.

>>> checked_image(b"\\x89PNG\\r\\n\\x1a\\n" + bytes(8), None)
Traceback (most recent call last):
...
ValueError: a PNG without its IEND chunk (truncated)
"""

from __future__ import annotations

import io
import re
import zlib

IMAGE_CHECKS = ("structure", "decode", "none")


def checked_image(data: bytes, resize: int | None, check: str = "structure") -> bytes:
    """``data`` if it is a whole image (or, with ``resize``, re-encoded as JPEG with its longer
    side at most ``resize``); raises ``ValueError`` (or Pillow's error) for a damaged file.

    ``check="structure"`` walks a JPEG from marker to marker (every segment's length, and the
    compressed data up to the end marker: a byte ``0xFF`` there may only be followed by
    ``0x00``, a restart marker or a marker that can follow a scan) and a PNG from chunk to chunk
    (every chunk's CRC-32, up to ``IEND``), without decoding the pixels: it catches a file cut
    short, and garbage written over its middle with the start and end intact (in the compressed
    data of a JPEG, a stretch of ~1 KB of random bytes holds a ``0xFF`` followed by an
    impossible byte with a probability above 97%; in a PNG, any change fails the CRC).
    It does not catch bit errors in a JPEG's compressed data that keep its structure (the
    decoder then decodes wrong pixels, or refuses). Other formats go through Pillow's
    ``verify``. ``check="decode"`` also decodes every image (JPEG with simplejpeg when it is
    installed, as ``decode_images`` does, else Pillow); ``check="none"`` stores the bytes as
    they are.

    >>> checked_image(b"\\xff\\xd8\\xff\\xd9", None)[:2]
    b'\\xff\\xd8'
    >>> checked_image(b"\\xff\\xd8\\xff\\xda\\x00\\x02 ... cut", None)
    Traceback (most recent call last):
    ...
    ValueError: a JPEG without its end marker (truncated)
    >>> checked_image(b"\\xff\\xd8\\xff\\xda\\x00\\x02 .\\xff\\x5f. \\xff\\xd9", None)
    Traceback (most recent call last):
    ...
    ValueError: a JPEG with garbage in its compressed data at byte 8 (0xFF 0x5F is no marker)
    """
    if check == "none" and resize is None:
        return data
    if data[:2] == b"\xff\xd8":
        check_jpeg_structure(data)
    elif data[:8] == b"\x89PNG\r\n\x1a\n":
        check_png_structure(data)
    elif resize is None and check == "structure":
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:
            image.verify()  # headers and structure, without decoding the pixels
        return data
    if resize is None and check == "structure":
        return data
    if resize is None and data[:3] == b"\xff\xd8\xff":
        try:
            import simplejpeg
        except ImportError:
            pass
        else:
            simplejpeg.decode_jpeg(data, min_height=1, min_width=1)  # scaled: still every bit
            return data
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        if resize is None:
            image.load()  # every pixel decoded
            return data
        image = image.convert("RGB")
        image.thumbnail((resize, resize))
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=90)
        return out.getvalue()


# After 0xFF in a JPEG's compressed data: 0x00 (a stuffed 0xFF), RST0-7, or a marker that ends
# the scan; the first byte that is none of these (0xFF: fill) ends the scan. A pattern with a
# literal first byte (re scans ~2 GB/s for it; one that starts "\xff+" ran 30x slower).
_JPEG_SCAN_END = re.compile(rb"\xff[\x01-\xcf\xd8-\xfe]")
_JPEG_AFTER_SCAN = frozenset({0xC4, 0xCC, 0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xFE, *range(0xE0, 0xF0)})
_JPEG_NO_LENGTH = frozenset({0x01, *range(0xD0, 0xD8)})


def check_jpeg_structure(data: bytes) -> None:
    """Walk the JPEG ``data`` from its start marker to its end marker (see
    :func:`checked_image`); ``ValueError`` naming the first damaged byte."""
    end = len(data.rstrip(b"\x00"))
    pos = 2
    while True:
        if pos + 2 > end:
            raise ValueError("a JPEG without its end marker (truncated)")
        if data[pos] != 0xFF:
            raise ValueError(f"a JPEG damaged at byte {pos:,} (no marker where one must be)")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0xD9:
            break
        if marker in _JPEG_NO_LENGTH:
            pos += 2
            continue
        if marker < 0xC0 or marker == 0xD8:
            raise ValueError(f"a JPEG damaged at byte {pos:,} (0xFF 0x{marker:02X} is no marker)")
        if pos + 4 > end:
            raise ValueError("a JPEG without its end marker (truncated)")
        length = (data[pos + 2] << 8) | data[pos + 3]
        if length < 2 or pos + 2 + length > end:
            raise ValueError(
                f"a JPEG truncated or damaged at byte {pos:,} (a segment of "
                f"{length:,} bytes, {end - pos - 2:,} left in the file)"
            )
        pos += 2 + length
        if marker == 0xDA:  # a scan: compressed data up to the next marker
            found = _JPEG_SCAN_END.search(data, pos, end)
            if found is None:
                raise ValueError("a JPEG without its end marker (truncated)")
            pos = found.start()
            after = data[pos + 1]
            if after not in _JPEG_AFTER_SCAN:
                raise ValueError(
                    f"a JPEG with garbage in its compressed data at byte "
                    f"{pos:,} (0xFF 0x{after:02X} is no marker)"
                )
    rest = end - pos - 2
    if rest > 0 and data[pos + 2 : pos + 4] != b"\xff\xd8":  # not a second image (MPO)
        raise ValueError(f"a JPEG with {rest:,} bytes of garbage after its end marker")


def check_png_structure(data: bytes) -> None:
    """Walk the PNG ``data`` chunk by chunk up to ``IEND``, checking each chunk's CRC-32;
    ``ValueError`` naming the first damaged chunk."""
    view = memoryview(data)
    pos, size = 8, len(data)
    while True:
        if pos + 12 > size:
            raise ValueError("a PNG without its IEND chunk (truncated)")
        length = int.from_bytes(view[pos : pos + 4], "big")
        stop = pos + 12 + length
        if stop > size:
            raise ValueError("a PNG without its IEND chunk (truncated)")
        if zlib.crc32(view[pos + 4 : stop - 4]) != int.from_bytes(view[stop - 4 : stop], "big"):
            kind = bytes(view[pos + 4 : pos + 8]).decode("latin-1")
            raise ValueError(
                f"a PNG damaged in its {kind!r} chunk at byte {pos:,} (its CRC does not match)"
            )
        if view[pos + 4 : pos + 8] == b"IEND":
            return
        pos = stop
