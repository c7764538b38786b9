"""Data for the labs: a byte-level tokenizer, the shipped corpus, and layout-independent batches.

The global batch of iteration ``i`` is the same samples whatever the parallel layout, so a parallel
run can be compared with a single-device run step by step. How the global batch is dealt out
follows Megatron-LM's ``MegatronPretrainingSampler``: each step of the data loader takes
``micro_batch_size * dp`` consecutive samples and data-parallel rank r keeps the r-th
``micro_batch_size`` of them; ``num_microbatches = global_batch_size / (micro_batch_size * dp)``
such steps make one iteration (the gradient-accumulation steps; Megatron-LM
``megatron/core/num_microbatches_calculator.py``).
"""
from __future__ import annotations

from pathlib import Path

import torch

from .config import BYTE_VOCAB_SIZE

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
CORPUS = DATA_DIR / "corpus" / "tinyshakespeare.txt"


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocabulary 256, no unknown tokens, nothing to download."""

    vocab_size = BYTE_VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def load_tokens(path: Path | str = CORPUS) -> torch.Tensor:
    """The corpus as a 1-D int64 tensor of byte ids."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"corpus not found at {path}; it ships with the repository under data/")
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).long()


def get_batch(tokens: torch.Tensor, iteration: int, global_batch_size: int, seq_length: int,
              seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``iteration``: (inputs, labels), each [global_batch_size, seq_length].

    Sample j starts at a random offset drawn from a generator seeded by (seed, iteration), so it
    does not depend on how many ranks read it; labels are the inputs shifted by one token.
    """
    if len(tokens) <= seq_length + 1:
        raise ValueError(f"corpus of {len(tokens)} tokens is too short for seq_length {seq_length}")
    gen = torch.Generator().manual_seed(seed * 1_000_003 + iteration)
    starts = torch.randint(0, len(tokens) - seq_length - 1, (global_batch_size,), generator=gen)
    idx = starts[:, None] + torch.arange(seq_length + 1)         # [B, s+1]
    window = tokens[idx]
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


def microbatches(inputs: torch.Tensor, labels: torch.Tensor, micro_batch_size: int, dp: int = 1,
                 dp_rank: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This data-parallel rank's microbatches of one global batch, in Megatron's sampler order.

    Microbatch j of rank r holds samples [j*mbs*dp + r*mbs, j*mbs*dp + (r+1)*mbs).
    """
    gbs = inputs.shape[0]
    if gbs % (micro_batch_size * dp):
        raise ValueError(f"global batch {gbs} is not divisible by micro_batch_size * dp = "
                         f"{micro_batch_size} * {dp}")
    out = []
    for j in range(gbs // (micro_batch_size * dp)):
        lo = j * micro_batch_size * dp + dp_rank * micro_batch_size
        out.append((inputs[lo:lo + micro_batch_size], labels[lo:lo + micro_batch_size]))
    return out
