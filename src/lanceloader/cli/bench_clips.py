"""``lanceloader bench --clips`` / ``--audio``: time video clips or audio windows per second
through the Loader (``Loader(clips=ll.video_clips(...))``), not a video dataset's raw blob
bytes, which is what a plain ``bench`` of it reads.

``--clips frames=16,stride=2,size=112x112`` takes ``ll.video_clips``' settings as
``KEY=VALUE`` pairs (``column``, ``frames``, ``stride``, ``step``, ``per_video``, ``size`` as
``HxW``, ``layout``); ``--audio seconds=2,sample_rate=16000`` ``ll.audio_clips``' (``column``,
``seconds``, ``step``, ``per_file``, ``sample_rate``, ``channels``). Each batch is then
``--batch-size`` clips, decoded in the workers, and the stats' rows are clips.

>>> clips_spec("frames=8, stride=2, size=32x48", "--clips")
VideoClips(column='video', frames=8, stride=2, step=None, per_video=None, size=(32, 48), layout='NFCHW')
>>> clips_spec("seconds=0.5,sample_rate=16000", "--audio").sample_rate
16000
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from lanceloader.cli.errors import CommandError
from lanceloader.rows.clips.windows import Clips, audio_clips, video_clips

VIDEO_KEYS = {"column": str, "frames": int, "stride": int, "step": int, "per_video": int,
              "size": "HxW", "layout": str}  # fmt: skip
AUDIO_KEYS = {"column": str, "seconds": float, "step": float, "per_file": int,
              "sample_rate": int, "channels": int}  # fmt: skip
EXAMPLE = {"--clips": "frames=16,stride=2,size=112x112", "--audio": "seconds=2,sample_rate=16000"}


def add_clip_options(parser: argparse.ArgumentParser) -> None:
    """``--clips`` and ``--audio`` on ``lanceloader bench``'s parser."""
    parser.add_argument(
        "--clips",
        metavar="KEY=VALUE,...",
        help="time video clips through the Loader (clips/s), not raw blob bytes: "
        "ll.video_clips' settings, e.g. frames=16 or frames=16,stride=2,size=112x112 "
        f"(keys: {', '.join(VIDEO_KEYS)})",
    )
    parser.add_argument(
        "--audio",
        metavar="KEY=VALUE,...",
        help="time audio windows through the Loader (windows/s): ll.audio_clips' settings, "
        f"e.g. seconds=2 or seconds=2,sample_rate=16000 (keys: {', '.join(AUDIO_KEYS)})",
    )


def clips_setting(args: argparse.Namespace) -> Clips | None:
    """The Loader's ``clips`` from ``--clips`` or ``--audio`` (not both), else None."""
    video, audio = getattr(args, "clips", None), getattr(args, "audio", None)
    if video is not None and audio is not None:
        raise CommandError("--clips and --audio: give one (a Loader reads one kind of clips)")
    if video is None and audio is None:
        return None
    if args.decode_images:
        raise CommandError("--decode-images decodes images; clips are decoded already: drop it")
    return clips_spec(video, "--clips") if video is not None else clips_spec(audio, "--audio")


def clips_spec(text: str, flag: str) -> Clips:
    """``KEY=VALUE,...`` of ``flag`` as ``ll.video_clips(...)`` or ``ll.audio_clips(...)``;
    a bad key or value is a :class:`CommandError` naming it and an example."""
    keys = VIDEO_KEYS if flag == "--clips" else AUDIO_KEYS
    settings: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or key not in keys or key in settings:
            raise CommandError(
                f"{flag} {text!r}: {item!r} is not KEY=VALUE with KEY one of "
                f"{', '.join(keys)} (once each); e.g. {flag} {EXAMPLE[flag]}"
            )
        settings[key] = _value(flag, key, value, keys[key])
    try:
        return video_clips(**settings) if flag == "--clips" else audio_clips(**settings)
    except (TypeError, ValueError) as exc:
        raise CommandError(f"{flag} {text!r}: {exc}") from exc


def _value(flag: str, key: str, value: str, kind: Any) -> Any:
    """``value`` as the type of ``key``."""
    try:
        if kind == "HxW":
            height, width = value.lower().split("x")
            return (int(height), int(width))
        return kind(value)
    except ValueError as exc:
        want = {int: "an integer", float: "a number", "HxW": "HxW, e.g. 112x112"}.get(kind, kind)
        raise CommandError(f"{flag}: {key}={value!r} must be {want}") from exc


def media_hint(schema_names: list[str]) -> str | None:
    """A line for a plain ``bench`` of a dataset of videos or audio files (the index columns
    ``convert`` writes): what it times, and the flag that times clips instead."""
    for flag, suffix in (("--clips", "_keyframe_offsets"), ("--audio", "_seek_samples")):
        columns = [n.removesuffix(suffix) for n in schema_names if n.endswith(suffix)]
        if columns:
            default = "video" if flag == "--clips" else "audio"
            column = "" if columns[0] == default else f"column={columns[0]},"
            return (
                f"note: {columns[0]!r} holds media files, read here as raw bytes; add "
                f"{flag} {column}{EXAMPLE[flag]} to time "
                f"{'clips' if flag == '--clips' else 'windows'} through the Loader"
            )
    return None


@contextlib.contextmanager
def media_hints(args: argparse.Namespace) -> Iterator[None]:
    """A :class:`CommandError` of a plain ``bench`` (no ``--clips``/``--audio``) of a dataset
    of media files, such as the nulls of an MKV's index columns, with :func:`media_hint`
    added: what times that dataset is ``--clips``/``--audio``."""
    try:
        yield
    except CommandError as exc:
        if getattr(args, "clips", None) or getattr(args, "audio", None):
            raise
        try:
            import lance

            hint = media_hint(lance.dataset(args.uri).schema.names)
        except Exception:  # not a dataset we can open: the error as it was
            hint = None
        if hint is None:
            raise
        raise CommandError(f"{exc}; {hint.removeprefix('note: ')}") from exc
