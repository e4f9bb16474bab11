"""Train a tiny CNN on JPEG images stored in Lance; the loader's workers decode them.

The script writes a small dataset of JPEG bytes and labels to a temporary directory (class k is a
colour, plus noise), then trains for a few steps. ``decode_images`` decodes, resizes and
normalises each batch in the worker pool, and the loader hands the training loop a float32
``[N, H, W, C]`` torch tensor.

Run it::

    python examples/train_images.py --rows 512 --steps 40
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time

import lance
import numpy as np
import pyarrow as pa
import torch
from PIL import Image
from torch import nn

import lanceloader as ll
from lanceloader.batch.images import decode_images

COLOURS = np.array([[200, 40, 40], [40, 200, 40], [40, 40, 200], [200, 200, 40]])


def make_images(rows: int, size: int = 40, seed: int = 0) -> pa.Table:
    """``rows`` JPEGs of ``size`` x ``size`` pixels; the label is the index of the base colour."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(COLOURS), rows)
    images = []
    for label in labels:
        pixels = COLOURS[label] + rng.normal(0, 40, (size, size, 3))
        buf = io.BytesIO()
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        images.append(buf.getvalue())
    return pa.table({"image": pa.array(images, pa.binary()), "label": labels.astype(np.int64)})


def make_model(classes: int = len(COLOURS)) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, classes),
    )


def train(uri: str, steps: int, batch_size: int = 64, image_size: int = 32) -> list[float]:
    """Losses of ``steps`` SGD steps over shuffled epochs of the dataset at ``uri``."""
    torch.manual_seed(0)
    model = make_model()
    optimiser = torch.optim.Adam(model.parameters(), lr=0.02)
    transform = decode_images(
        "image", size=image_size, dtype="float32", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)
    )
    loader = ll.Loader(
        uri, batch_size=batch_size, shuffle=True, seed=0, transform=transform, output="torch"
    )
    losses: list[float] = []
    with loader:
        while len(losses) < steps:
            for batch in loader:  # one epoch
                images = batch["image"].permute(0, 3, 1, 2)  # NHWC -> NCHW
                loss = nn.functional.cross_entropy(model(images), batch["label"])
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                losses.append(loss.item())
                if len(losses) == steps:
                    break
    return losses


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=512, help="images to generate")
    parser.add_argument("--steps", type=int, default=40, help="training steps")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        uri = lance.write_dataset(make_images(args.rows), f"{tmp}/images.lance").uri
        losses = train(uri, args.steps, args.batch_size)
    result = {
        "first_loss": float(np.mean(losses[:3])),
        "last_loss": float(np.mean(losses[-3:])),
        "seconds": time.perf_counter() - start,
    }
    print(
        f"{args.steps} steps: loss {result['first_loss']:.3f} -> {result['last_loss']:.3f} "
        f"in {result['seconds']:.1f}s"
    )
    return result


if __name__ == "__main__":
    main()
