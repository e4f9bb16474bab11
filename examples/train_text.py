"""Train a tiny text classifier on sentences stored in Lance; the loader's workers tokenize them.

The script writes a small dataset of sentences and labels to a temporary directory (label 1 when
the sentence is upbeat), trains a WordLevel tokenizer on it locally (nothing is downloaded), then
trains a bag-of-embeddings model for a few steps. ``tokenize`` runs in the worker pool and the
loader hands the training loop padded ``input_ids`` and ``attention_mask`` torch tensors.

Run it::

    python examples/train_text.py --rows 1024 --steps 40
"""

from __future__ import annotations

import argparse
import tempfile
import time

import lance
import numpy as np
import pyarrow as pa
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from torch import nn

import lanceloader as ll
from lanceloader.batch.text import tokenize

SUBJECTS = ["the loader", "this dataset", "my model", "the epoch", "our shuffle", "that batch"]
GOOD = ["is great", "looks fast", "works well", "feels smooth", "is brilliant"]
BAD = ["is broken", "looks slow", "fails often", "feels stuck", "is awful"]
FILLER = ["today", "again", "as usual", "on every rank", "after resume", ""]


def make_sentences(rows: int, seed: int = 0) -> pa.Table:
    """``rows`` sentences; label 1 for an upbeat predicate, 0 for a gloomy one."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, rows)
    texts = [
        f"{rng.choice(SUBJECTS)} {rng.choice(GOOD if label else BAD)} {rng.choice(FILLER)}".strip()
        for label in labels
    ]
    return pa.table({"text": pa.array(texts, pa.string()), "label": labels.astype(np.int64)})


def train_tokenizer(texts: list[str]) -> Tokenizer:
    """A word-level tokenizer trained on ``texts`` (in a real project: load your own from disk)."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"])
    )
    return tokenizer


class BagOfEmbeddings(nn.Module):
    """Mean of the token embeddings (padding masked out), then a linear classifier."""

    def __init__(self, vocab: int, dim: int = 16, classes: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.unsqueeze(-1).float()
        pooled = (self.embed(ids) * weights).sum(1) / weights.sum(1).clamp(min=1)
        return self.head(pooled)


def train(uri: str, tokenizer: Tokenizer, steps: int, batch_size: int = 64) -> list[float]:
    """Losses of ``steps`` optimiser steps over shuffled epochs of the dataset at ``uri``."""
    torch.manual_seed(0)
    model = BagOfEmbeddings(tokenizer.get_vocab_size())
    optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
    loader = ll.Loader(
        uri,
        batch_size=batch_size,
        shuffle=True,
        seed=0,
        transform=tokenize(tokenizer, "text", max_length=16),
        output="torch",
    )
    losses: list[float] = []
    with loader:
        while len(losses) < steps:
            for batch in loader:  # one epoch
                logits = model(batch["input_ids"], batch["attention_mask"])
                loss = nn.functional.cross_entropy(logits, batch["label"])
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                losses.append(loss.item())
                if len(losses) == steps:
                    break
    return losses


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1024, help="sentences to generate")
    parser.add_argument("--steps", type=int, default=40, help="training steps")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    table = make_sentences(args.rows)
    tokenizer = train_tokenizer(table.column("text").to_pylist())
    with tempfile.TemporaryDirectory() as tmp:
        uri = lance.write_dataset(table, f"{tmp}/sentences.lance").uri
        losses = train(uri, tokenizer, args.steps, args.batch_size)
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
