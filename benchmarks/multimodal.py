"""Video clips (and audio windows) as samples: the Loader against hand-written loops.

Two cases of synthetic H.264 MP4 videos, generated once and kept under ``--data-dir``
(``benchmarks/data/multimodal/``, one folder per case's parameters; one video is encoded and
copied to the others, so a first run costs one encode per case: about 20 s and 1-2 min on 2
cores):

``small``
    8 videos of 60 s at 24 fps, 144x256, a keyframe every 24 frames, every frame noise
    (``tests/mediagen.py``): 9.7 MB per file; 64 clips; batches of 8.
``large``
    like the files of the issue's users (LeRobot episodes, OpenVid): 6 videos of 60 s at
    24 fps, 480x640, a keyframe every 48 frames, a slowly panning textured scene: 27 MB per
    file, where fetching a file whole costs ~25x the GOPs of one clip; 48 clips; batches of 4
    (a clip of 16 frames is 14.7 MB decoded).

Every side decodes the same clips (every clip of ``--clip-frames`` frames, stride 1, spread
evenly over each video) with the same decoder (PyAV's bundled FFmpeg) on the same number of
worker threads (``--workers``):

``local``
    ``Loader(dataset, clips=ll.video_clips(...))`` on a local Lance dataset (a blob column and
    the keyframe index) vs a hand loop on a thread pool that opens each clip's MP4 file from
    local disk, seeks to the clip's keyframe and decodes forward to the clip's frames.
``object store``
    The same Loader on the loopback S3 server behind the tests' fault proxy (``+--latency-ms``
    per request, each response at ``--bandwidth-mbs``: 100 MB/s, about what one S3 GET stream
    gives; the loopback alone moves a 27 MB file in ~60 ms, which no object store does) vs the
    hand loop fetching each clip's file whole from the same server and proxy (a GET per clip),
    then decoding as above; and the loader on the store against its own local rate (what the
    latency costs it).
``bytes / GETs``
    Bytes the Loader's plan reads per clip (``clip_byte_ranges``) against the bytes of the GOPs
    the clip spans; GETs per clip from the server's log (no cache); the second epoch's GETs
    through ``cache=`` a directory (small case).
``blobs`` / ``audio``
    BLOB's ``benchmarks/blobs.py`` and AUDIO's ``benchmarks/multimodal_audio.py`` ``run``
    when they are there (``--video-only`` leaves them out).

Clips/s are medians of ``--repeats`` runs, the cases alternated within each repeat (the machine
is shared: compare ratios, not absolutes); ratios are medians of the per-repeat ratios, the
spread (min-max). Printed as a markdown table.

Usage::

    python benchmarks/multimodal.py                     # both cases, 3 repeats, + audio, blobs
    python benchmarks/multimodal.py --cases large --repeats 5 --video-only
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import io
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
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


def spread(values: list[float], digits: int = 1) -> str:
    return (
        f"{statistics.median(values):.{digits}f} "
        f"({min(values):.{digits}f}-{max(values):.{digits}f})"
    )


@dataclass(frozen=True)
class Case:
    """One benchmark case: ``videos`` copies of one generated video and the clips read."""

    name: str
    videos: int
    frames: int  # per video, at 24 fps
    size: tuple[int, int]  # (height, width)
    gop: int
    content: str  # "noise" (tests/mediagen.py) or "pan" (a panning texture, encodes fast)
    clips_per_video: int
    batch_size: int

    def folder(self, data_dir: Path) -> Path:
        h, w = self.size
        return data_dir / f"{self.content}-{h}x{w}-{self.frames}f-gop{self.gop}-x{self.videos}"


CASES = {
    "small": Case("small", 8, 1440, (144, 256), 24, "noise", 8, 8),
    "large": Case("large", 6, 1440, (480, 640), 48, "pan", 8, 4),
}


def write_pan_video(path: Path, frames: int, size: tuple[int, int], gop: int) -> None:
    """A 24 fps H.264 MP4 (``+faststart``, closed GOPs of ``gop``, 2 B-frames) of a textured
    scene panning one pixel per frame, with ``tests/mediagen.py``'s frame-index grid on top
    (``frame_index_of`` reads frame *i* back as *i*): keyframes cost what a textured frame
    costs, predicted frames little, and x264's ultrafast preset encodes it in real time."""
    from mediagen import DARK, GRID_COLUMNS, GRID_ROWS, INDEX_BITS, LIGHT

    height, width = size
    texture = np.random.default_rng(0).integers(-24, 25, (height, width + frames), np.int16)
    rows = np.minimum(np.arange(height) * GRID_ROWS // height, GRID_ROWS - 1)
    columns = np.minimum(np.arange(width) * GRID_COLUMNS // width, GRID_COLUMNS - 1)
    with av.open(str(path), "w", options={"movflags": "+faststart"}) as container:
        stream = container.add_stream("libx264", rate=24)
        stream.height, stream.width, stream.pix_fmt = height, width, "yuv420p"
        stream.options = {
            "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes=2:open-gop=0",
            "preset": "ultrafast",
        }
        for i in range(frames):
            bits = (i >> np.arange(INDEX_BITS)) & 1
            grid = np.where(bits == 1, LIGHT, DARK).reshape(GRID_ROWS, GRID_COLUMNS)
            gray = grid[rows[:, None], columns[None, :]] + texture[:, i : i + width]
            pixels = np.repeat(np.clip(gray, 0, 255).astype(np.uint8)[:, :, None], 3, axis=2)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode(None))


def case_videos(case: Case, data_dir: Path) -> list[Path]:
    """The case's video files, made once under ``data_dir`` (one encode, copied): kept between
    runs, written under temporary names and renamed, so an interrupted run leaves no half file."""
    folder = case.folder(data_dir)
    paths = [folder / f"v{i:03d}.mp4" for i in range(case.videos)]
    if all(p.exists() for p in paths):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    base = folder / "base.tmp.mp4"
    t0 = time.perf_counter()
    if case.content == "noise":
        write_video(base, case.frames, 24, case.size, gop=case.gop)
    else:
        write_pan_video(base, case.frames, case.size, case.gop)
    print(f"(generated the {case.name} case's video in {time.perf_counter() - t0:.0f} s)")
    for p in paths:
        shutil.copyfile(base, p.with_suffix(".tmp"))
        p.with_suffix(".tmp").rename(p)
    base.unlink()
    return paths


Row = tuple[str, str, str, str, str]


def target_row(measure: str, case: str, values: list[float], target: float) -> Row:
    met = "met" if statistics.median(values) >= target else "NOT met"
    return (measure, case, spread(values, 2), f">= {target:g}", met)


def run_case(case: Case, args: argparse.Namespace, s3: Any, proxy: Any, root: Path) -> list[Row]:
    """The table's rows for one case: clips/s of the four sides, the target ratios, bytes and
    GETs per clip (and, for the small case, the second epoch's GETs through ``cache=``)."""
    frames, workers = args.clip_frames, args.workers
    paths = case_videos(case, Path(args.data_dir))
    table = video_dataset_table(paths)
    local = str(root / f"{case.name}.lance")
    lance.write_dataset(table, local, data_storage_version="2.2")
    step = max(frames, case.frames // case.clips_per_video)
    spec = ll.video_clips("video", frames=frames, step=step)
    clips = [(p, s) for p in paths for s in range(0, case.frames - frames + 1, step)]
    remote = s3.write(table, data_storage_version="2.2")
    bucket = remote.split("/")[2]
    uploader = s3_client(s3.storage_options, s3.endpoint)
    for p in paths:  # the same files as objects, for the hand loop's whole-file GETs
        uploader.put_object(Bucket=bucket, Key=f"files/{p.name}", Body=p.read_bytes())
    options = {**s3.storage_options, "endpoint": proxy.endpoint}
    label = f"{case.name}: "

    def loader_epoch(uri: str, **kw: Any) -> Callable[[], int]:
        loader = ll.Loader(
            uri, batch_size=case.batch_size, clips=spec, num_workers=workers, cache=None, **kw
        )
        return lambda: sum(len(b["clip_start"]) for b in loader)

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

    sides = {
        "loader, local": loader_epoch(local),
        "hand loop, local files": hand(str),
        "loader, object store": loader_epoch(remote, storage_options=options),
        "hand loop, whole files from the store": hand(from_store),
    }
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, fn in sides.items():  # alternated within each repeat
            rates[name].append(timed(fn))
    rows: list[Row] = [("clips/s", label + name, spread(v), "", "") for name, v in rates.items()]

    def ratios(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(rates[a], rates[b], strict=True)]

    rows.append(
        target_row(
            "ratio",
            label + "loader / hand loop, local",
            ratios("loader, local", "hand loop, local files"),
            1.0,
        )
    )
    rows.append(
        target_row(
            "ratio",
            label + "loader on the store / hand loop fetching whole files",
            ratios("loader, object store", "hand loop, whole files from the store"),
            3.0,
        )
    )
    on_store = ratios("loader, object store", "loader, local")

    # what the emulated store costs on the same cores: the loader's CPU per clip on the store
    # (this process) beside the S3 server's and the proxy's (Python processes, children)
    def children_cpu() -> float:
        ticks = 0
        for child in (s3._process, proxy._process):  # the test helpers' Popen objects
            fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime + stime
        return ticks / os.sysconf("SC_CLK_TCK")

    before, own = children_cpu(), time.process_time()
    n = sides["loader, object store"]()
    emulator = (children_cpu() - before) / n * 1000
    rows.append(("CPU ms per clip", label + "loader on the store / the emulated store (server + proxy)",
                 f"{(time.process_time() - own) / n * 1000:.0f} / {emulator:.0f}", "", ""))  # fmt: skip
    rows.append(("ratio", label + "loader on the store / loader local", spread(on_store, 2),
                 "~1.0", ""))  # fmt: skip

    # bytes the plan reads per clip, against the GOPs the clip spans
    planned, gops, whole = [], [], []
    infos = {p: media_video.probe_video(p) for p in paths}
    for path, start in clips:
        info, size = infos[path], path.stat().st_size
        ranges = media_video.clip_byte_ranges(info, size, start, frames, 1)
        planned.append(sum(n for _, n in ranges))
        first, last = info.gop_of(start), info.gop_of(start + frames - 1)
        end = int(info.keyframe_offsets[last + 1]) if last + 1 < len(info.keyframes) else size
        gops.append(end - int(info.keyframe_offsets[first]))
        whole.append(size)
    ratio = np.array(planned) / np.array(gops)
    rows.append(
        (
            "bytes per clip",
            label + "planned / bytes of the GOPs spanned",
            f"{np.median(ratio):.2f} (max {ratio.max():.2f}); {np.median(planned) / 1e6:.2f} MB "
            f"of {np.median(whole) / 1e6:.1f} MB files",
            "<= 2",
            "met" if ratio.max() <= 2 else "NOT met",
        )
    )

    # GETs per clip (no cache), and the second epoch through cache=
    loader = ll.Loader(remote, batch_size=case.batch_size, clips=spec, num_workers=workers,
                       storage_options=options, cache=None)  # fmt: skip
    s3.requests(reset=True)
    n = sum(len(b["clip_start"]) for b in loader)
    gets = s3.requests().get("GET", 0) / n
    rows.append(
        (
            "GETs per clip",
            label + "no cache",
            f"{gets:.2f}",
            "<= 3",
            "met" if gets <= 3 else "NOT met",
        )
    )
    if case.name == "small":
        cached = ll.Loader(remote, batch_size=case.batch_size, clips=spec, num_workers=workers,
                           storage_options=options, cache=str(root / "cache"))  # fmt: skip
        for _ in cached:
            pass
        s3.requests(reset=True)
        for _ in cached:
            pass
        second = s3.requests().get("GET", 0)
        rows.append(("GETs", label + "second epoch through cache=", str(second), "0",
                     "met" if second == 0 else "NOT met"))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="small,large", help=f"of {', '.join(CASES)}")
    parser.add_argument("--clip-frames", type=int, default=16)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument(
        "--bandwidth-mbs",
        type=float,
        default=100.0,
        help="MB/s of each response body (one S3 GET stream: ~100); 0: the loopback's",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-dir", default=str(HERE / "data" / "multimodal"))
    parser.add_argument("--video-only", action="store_true", help="leave out audio and blobs")
    args = parser.parse_args()
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        parser.error(f"--cases: unknown {unknown}; pick from {list(CASES)}")
    scratch = tempfile.TemporaryDirectory()
    root = Path(scratch.name)
    s3 = S3()
    proxy = ProxyProcess(s3.endpoint)
    rows: list[Row] = []
    try:
        proxy.set(latency_s=args.latency_ms / 1000, bandwidth=args.bandwidth_mbs * 1e6)
        for name in args.cases.split(","):
            rows.extend(run_case(CASES[name], args, s3, proxy, root))
    finally:
        proxy.stop()
        s3.stop()

    audio = None if args.video_only else sibling("multimodal_audio")
    if audio is None and not args.video_only:
        rows.append(("audio crops/s", "benchmarks/multimodal_audio.py not there", "", "", ""))
    elif audio is not None:
        for row in audio.run(tempfile.mkdtemp(), args.workers, repeats=args.repeats):
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

    for name in args.cases.split(","):
        c = CASES[name]
        print(
            f"{name}: {c.videos} videos of {c.frames} frames {c.size[0]}x{c.size[1]}, GOP "
            f"{c.gop}, {c.content}; {c.videos * c.clips_per_video} clips of {args.clip_frames} "
            f"frames, batches of {c.batch_size}"
        )
    print(
        f"{args.workers} workers; +{args.latency_ms:g} ms per request, "
        f"{args.bandwidth_mbs:g} MB/s per response (0: unlimited); medians of "
        f"{args.repeats} (min-max); load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| measure | case | value | target | |\n|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(v) for v in (list(row) + [""] * 5)[:5]) + " |")
    blobs = None if args.video_only else sibling("blobs")
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
