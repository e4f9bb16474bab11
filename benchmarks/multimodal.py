"""Video clips (and audio windows) as samples: the Loader against hand-written loops.

Every side decodes the same clips (every clip of ``--clip-frames`` frames, stride 1, of
``--videos`` synthetic H.264 videos from ``tests/mediagen.py``) with the same decoder (PyAV's
bundled FFmpeg) on the same number of threads (``--workers``):

``local``
    ``Loader(dataset, clips=ll.video_clips(...))`` on a local Lance dataset (a blob column and
    the keyframe index) vs a hand loop on a thread pool that opens each clip's MP4 file from
    local disk, seeks to the clip's keyframe and decodes forward to the clip's frames.
``object store``
    The same Loader on the loopback S3 server behind the tests' fault proxy (``+--latency-ms``
    per request) vs the hand loop fetching each clip's file whole from the same server and proxy
    (a GET per clip), then decoding as above.
``bytes / GETs``
    Bytes the Loader's plan reads per clip (``clip_byte_ranges``) against the bytes of the GOPs
    the clip spans; GETs per clip from the server's log (no cache); the second epoch's GETs
    through ``cache=`` a directory.
``blobs`` / ``audio``
    BLOB's ``benchmarks/blobs.py`` and AUDIO's ``benchmarks/multimodal_audio.py`` ``run``
    when they are there.

Clips/s are medians of ``--repeats`` runs, the cases alternated within each repeat (the machine
is shared: compare ratios, not absolutes); the spread is (min-max). Printed as a markdown table.

Usage::

    python benchmarks/multimodal.py                  # 8 videos of 60 s, 64 clips, 3 repeats
    python benchmarks/multimodal.py --videos 12 --video-frames 480 --clips-per-video 4

Measured (2 workers on a shared 2-core machine, the defaults): bytes per clip 1.07x the GOPs
it spans (max 1.10x); 1.12 GETs per clip; 0 GETs in a second epoch through cache=; clips/s
0.9x (0.7-1.2x) the local hand loop (an epoch of 128 clips: 1.0x, 0.93-1.13x: a short epoch
ends with one worker decoding the last read alone) and 2.3x (2.2-2.6x) the loop fetching
whole files from the store. With 20 s videos (--video-frames 480, 48 clips) one run gave
0.5x (0.5-0.7x) and a smaller run 1.2-2.3x: the shorter the videos, the less a whole-file GET
costs beside the decode, and the more the shared machine's noise decides.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import io
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import av
import lance
import lance.blob
import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import lanceloader as ll  # noqa: E402
from conftest import S3  # noqa: E402
from faultproxy import ProxyProcess  # noqa: E402
from lanceloader.media import video as media_video  # noqa: E402
from mediagen import write_video  # noqa: E402


def video_dataset_table(paths: list[Path]) -> pa.Table:
    """A blob column of the files, their names and the keyframe index (what convert writes)."""
    datas = [p.read_bytes() for p in paths]
    rows = [media_video.index_values(media_video.probe_video(d), "video") for d in datas]
    index = pa.Table.from_pylist(rows, schema=pa.schema(media_video.index_fields("video")))
    table = pa.table({"path": [p.name for p in paths], "video": lance.blob.blob_array(datas)})
    for name in index.column_names:
        table = table.append_column(name, index.column(name))
    return table


def decode_from(source: Any, start: int, frames: int) -> np.ndarray:
    """The hand loop's decode: open, seek to the keyframe at or before ``start`` (by time),
    decode forward, keep frames ``start .. start + frames - 1`` (by presentation time)."""
    with av.open(source) as container:
        stream = container.streams.video[0]
        rate = stream.average_rate
        base = stream.time_base
        first_pts = stream.start_time or 0
        target = first_pts + int(start / rate / base)
        container.seek(target, stream=stream, backward=True, any_frame=False)
        out = []
        for frame in container.decode(stream):
            index = round((frame.pts - first_pts) * base * rate)
            if index < start:
                continue
            out.append(frame.to_ndarray(format="rgb24"))
            if len(out) == frames:
                break
    return np.stack(out)


def s3_client(options: dict[str, str], endpoint: str) -> Any:
    """A boto3 S3 client of the test server at ``endpoint`` (the server, or the proxy)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=options["region"],
        aws_access_key_id=options["access_key_id"],
        aws_secret_access_key=options["secret_access_key"],
    )


def timed(fn: Callable[[], int]) -> float:
    t0 = time.perf_counter()
    clips = fn()
    return clips / (time.perf_counter() - t0)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--videos", type=int, default=8)
    parser.add_argument("--video-frames", type=int, default=1440, help="60 s at 24 fps")
    parser.add_argument("--size", default="144x256", help="HxW of the videos")
    parser.add_argument("--gop", type=int, default=24)
    parser.add_argument("--clip-frames", type=int, default=16)
    parser.add_argument(
        "--clips-per-video",
        type=int,
        default=8,
        help="clips spread evenly over each video (step = frames / this)",
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    height, width = (int(v) for v in args.size.split("x"))
    frames, workers = args.clip_frames, args.workers
    scratch = tempfile.TemporaryDirectory()
    root = Path(scratch.name)
    folder = root / "videos"
    folder.mkdir()
    paths = [
        write_video(folder / f"v{i:03d}.mp4", args.video_frames, 24, (height, width), gop=args.gop)
        for i in range(args.videos)
    ]
    table = video_dataset_table(paths)
    local = str(root / "videos.lance")
    lance.write_dataset(table, local, data_storage_version="2.2")
    step = max(frames, args.video_frames // args.clips_per_video)
    spec = ll.video_clips("video", frames=frames, step=step)
    clips = [(p, s) for p in paths for s in range(0, args.video_frames - frames + 1, step)]

    s3 = S3()
    proxy = ProxyProcess(s3.endpoint)
    rows: list[tuple[str, str, str, str, str]] = []
    try:
        remote = s3.write(table, data_storage_version="2.2")
        bucket = remote.split("/")[2]
        for p in paths:  # the same files as objects, for the hand loop's whole-file GETs
            s3_client(s3.storage_options, s3.endpoint).put_object(
                Bucket=bucket, Key=f"files/{p.name}", Body=p.read_bytes()
            )
        options = {**s3.storage_options, "endpoint": proxy.endpoint}
        proxy.set(latency_s=args.latency_ms / 1000)

        def loader_epoch(uri: str, **kw: Any) -> Callable[[], int]:
            def run() -> int:
                loader = ll.Loader(
                    uri, batch_size=8, clips=spec, num_workers=workers, cache=None, **kw
                )
                return sum(len(b["clip_start"]) for b in loader)

            return run

        def hand(fetch: Callable[[Path], Any]) -> Callable[[], int]:
            def one(clip: tuple[Path, int]) -> int:
                return len(decode_from(fetch(clip[0]), clip[1], frames))

            def run() -> int:
                with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                    return sum(1 for _ in pool.map(one, clips))

            return run

        clients = threading.local()

        def from_store(path: Path) -> io.BytesIO:
            if not hasattr(clients, "s3"):  # one client per thread (boto3's are not shared)
                clients.s3 = s3_client(s3.storage_options, proxy.endpoint)
            body = clients.s3.get_object(Bucket=bucket, Key=f"files/{path.name}")["Body"]
            return io.BytesIO(body.read())

        cases = {
            "loader, local": loader_epoch(local),
            "hand loop, local files": hand(str),
            "loader, object store": loader_epoch(remote, storage_options=options),
            "hand loop, whole files from the store": hand(from_store),
        }
        rates: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeats):
            for name, fn in cases.items():  # alternated within each repeat
                rates[name].append(timed(fn))
        for name, values in rates.items():
            rows.append(("clips/s", name, spread(values), "", ""))
        local_ratio = [
            a / b
            for a, b in zip(rates["loader, local"], rates["hand loop, local files"], strict=True)
        ]
        store_ratio = [
            a / b
            for a, b in zip(
                rates["loader, object store"],
                rates["hand loop, whole files from the store"],
                strict=True,
            )
        ]
        rows.append(
            (
                "ratio",
                "loader / hand loop, local",
                spread(local_ratio),
                ">= 1.0",
                "met" if statistics.median(local_ratio) >= 1.0 else "NOT met",
            )
        )
        rows.append(
            (
                "ratio",
                "loader on the store / hand loop fetching whole files",
                spread(store_ratio),
                ">= 3",
                "met" if statistics.median(store_ratio) >= 3 else "NOT met",
            )
        )

        # bytes the plan reads per clip, against the GOPs the clip spans
        planned, gops = [], []
        for path, start in clips:
            data = path.read_bytes()
            info = media_video.probe_video(data)
            ranges = media_video.clip_byte_ranges(info, len(data), start, frames, 1)
            planned.append(sum(n for _, n in ranges))
            first, last = info.gop_of(start), info.gop_of(start + frames - 1)
            end = (
                int(info.keyframe_offsets[last + 1])
                if last + 1 < len(info.keyframes)
                else len(data)
            )
            gops.append(end - int(info.keyframe_offsets[first]))
        ratio = np.array(planned) / np.array(gops)
        rows.append(
            (
                "bytes per clip",
                "planned / bytes of the GOPs spanned",
                f"{np.median(ratio):.2f} (max {ratio.max():.2f})",
                "<= 2",
                "met" if ratio.max() <= 2 else "NOT met",
            )
        )

        # GETs per clip (no cache), and the second epoch through cache=
        loader = ll.Loader(
            remote,
            batch_size=8,
            clips=spec,
            num_workers=workers,
            storage_options=options,
            cache=None,
        )
        s3.requests(reset=True)
        n = sum(len(b["clip_start"]) for b in loader)
        gets = s3.requests().get("GET", 0) / n
        rows.append(
            ("GETs per clip", "no cache", f"{gets:.2f}", "<= 3", "met" if gets <= 3 else "NOT met")
        )
        cached = ll.Loader(
            remote,
            batch_size=8,
            clips=spec,
            num_workers=workers,
            storage_options=options,
            cache=str(root / "cache"),
        )
        for _ in cached:
            pass
        s3.requests(reset=True)
        for _ in cached:
            pass
        second = s3.requests().get("GET", 0)
        rows.append(
            (
                "GETs",
                "second epoch through cache=",
                str(second),
                "0",
                "met" if second == 0 else "NOT met",
            )
        )
    finally:
        proxy.stop()
        s3.stop()

    audio = sibling("multimodal_audio")
    if audio is None:
        rows.append(("audio crops/s", "benchmarks/multimodal_audio.py not there", "", "", ""))
    else:
        for row in audio.run(tempfile.mkdtemp(), workers, repeats=args.repeats):
            rows.append(
                (
                    "audio crops/s",
                    f"{row['format']}: loader / hand loop",
                    f"{row['ratio']} ({row['ratio_spread']}); {row['loader_crops_s']} vs "
                    f"{row['hand_crops_s']}",
                    row["target"],
                    "met" if row["met"] else "NOT met",
                )
            )

    print(
        f"{args.videos} videos of {args.video_frames} frames {height}x{width}, GOP "
        f"{args.gop}; {len(clips)} clips of {frames} frames; {workers} workers; "
        f"+{args.latency_ms:g} ms per request; medians of {args.repeats} (min-max)\n"
    )
    print("| measure | case | value | target | |\n|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(v) for v in (list(row) + [""] * 5)[:5]) + " |")
    blobs = sibling("blobs")
    if blobs is not None:  # BLOB's benchmark prints its own table
        print("\nBlob bytes, the Loader vs Lance's read_blobs (benchmarks/blobs.py):\n")
        blobs.main(
            [
                "--data-dir",
                tempfile.mkdtemp(),
                "--rows",
                "500",
                "--repeats",
                str(max(3, args.repeats)),
                "--inline-sizes-kib",
                "",
            ]
        )


def sibling(name: str) -> Any:
    """The benchmark module ``benchmarks/<name>.py`` of another part, or None if absent."""
    path = HERE / f"{name}.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


if __name__ == "__main__":
    main()
