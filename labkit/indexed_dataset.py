"""Megatron-LM's indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``), byte for byte, and batches drawn
from it the way Megatron's ``GPTDataset`` draws them from a single file.

Format (``megatron/core/datasets/indexed_dataset.py`` @ d98e8a64, ``_IndexWriter``/``_IndexReader``):

    .idx  b"MMIDIDX\\x00\\x00" | <Q version 1 | <B dtype code | <Q sequence count n | <Q document count d
          | int32 lengths[n] | int64 byte pointers[n] | int64 document indices[d] | int8 modes[n] (optional)
    .bin  the tokens of every sequence, back to back, in the dtype of the code (uint16 for a vocabulary
          under 65500, as tools/preprocess_data.py chooses)

Document indices are sequence indices: 0, then the end of each document (one sequence per document
unless sentences were split). Reading checks every size and offset and names the file and the
fault; it never returns a silently wrong array. The .bin is memory-mapped (numpy.memmap) only
after its size matches the index, and every batch re-checks the size first (``check_size``): a
.bin truncated while a run holds it is a ValueError naming the file. What no check can prevent:
a truncation between that check and the read of the pages past the new end, which the kernel
answers with SIGBUS (the launcher then names the signal, and faulthandler prints the stack).

Sampling (``megatron/core/datasets/gpt_dataset.py`` and ``helpers.cpp:build_sample_idx`` @ d98e8a64):
the sequences are shuffled per epoch with ``numpy.random.RandomState(seed)`` into one token stream;
sample k is the ``seq_length + 1`` tokens from position ``k * seq_length`` (packing across documents;
the last token of a sample is the first of the next); the samples are shuffled with the same
generator; iteration i takes samples ``[i * gbs, (i + 1) * gbs)`` (``MegatronPretrainingSampler``).
That is Megatron's GPTDataset exactly for a run with ``--data-path PREFIX --split 100,0,0 --seed
SEED`` (the whole file is the training split) and ``num_samples = train_iters * global_batch_size``.
Simplified: no train/valid/test split, no blending of several files, no index cache on disk, no
EOD-based masks or position resets (``--reset-position-ids`` etc.), no padding of a last partial
sample (training drops it, as here).
"""
from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

HEADER = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}              # Megatron's DType enum
_CODES = {np.dtype(v): k for k, v in DTYPES.items()}
_FIXED = 9 + 8 + 1 + 8 + 8                           # header, version, code, two counts: 34 bytes


def _code(dtype) -> int:
    code = _CODES.get(np.dtype(dtype))
    if code is None:
        raise ValueError(f"dtype {dtype} has no Megatron code; use one of "
                         f"{[np.dtype(v).name for v in DTYPES.values()]}")
    return code


def write_indexed_dataset(prefix, sequences, dtype=np.uint16, document_indices=None,
                          sequence_modes=None) -> None:
    """Write ``prefix.bin`` and ``prefix.idx`` as Megatron's ``IndexedDatasetBuilder`` does.

    ``document_indices`` default: one document per sequence (``[0, 1, ..., n]``).
    ``sequence_modes``: the optional int8 mode per sequence (multimodal files).
    """
    dtype = np.dtype(dtype)
    code = _code(dtype)
    arrays = [np.asarray(s) for s in sequences]
    for i, a in enumerate(arrays):
        if a.ndim != 1:
            raise ValueError(f"sequence {i} has shape {a.shape}; sequences are 1-D token arrays")
        if a.size and dtype.kind in "iu" and (a.min() < np.iinfo(dtype).min or a.max() > np.iinfo(dtype).max):
            raise ValueError(f"sequence {i} has tokens outside {dtype.name}'s range")
    lengths = np.array([a.size for a in arrays], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)[:-1]]) * dtype.itemsize
    docs = np.arange(len(arrays) + 1) if document_indices is None else np.asarray(document_indices)
    _check_documents(docs, len(arrays), f"{prefix}.idx (to be written)")
    with open(f"{prefix}.bin", "wb") as f:
        for a in arrays:
            f.write(a.astype(dtype).tobytes(order="C"))
    with open(f"{prefix}.idx", "wb") as f:
        f.write(HEADER + struct.pack("<Q", 1) + struct.pack("<B", code))
        f.write(struct.pack("<Q", len(arrays)) + struct.pack("<Q", len(docs)))
        f.write(lengths.tobytes() + pointers.astype(np.int64).tobytes() + docs.astype(np.int64).tobytes())
        if sequence_modes is not None:
            f.write(np.asarray(sequence_modes, dtype=np.int8).tobytes())


def _check_documents(docs, n: int, where: str) -> None:
    if len(docs) == 0 or docs[0] != 0 or docs[-1] != n or np.any(np.diff(docs) < 0):
        raise ValueError(f"{where}: document indices must rise from 0 to the sequence count {n}; "
                         f"got {len(docs)} indices from {docs[0] if len(docs) else None} to "
                         f"{docs[-1] if len(docs) else None}")


class IndexedDataset(Sequence):
    """A Megatron .bin/.idx pair: ``ds[i]`` is sequence i's tokens (a read-only numpy view)."""

    def __init__(self, prefix):
        self.prefix = str(prefix)
        idx, bin_ = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
        for p in (idx, bin_):
            if not p.is_file():
                raise FileNotFoundError(f"{p}: no such file (an indexed dataset is PREFIX.bin + PREFIX.idx)")
        raw = idx.read_bytes()
        if len(raw) < _FIXED:
            raise ValueError(f"{idx}: truncated header ({len(raw)} bytes, the fixed header is {_FIXED})")
        if raw[:9] != HEADER:
            raise ValueError(f"{idx}: not a Megatron index file (starts {raw[:9]!r}, expected {HEADER!r})")
        version, code, n, d = struct.unpack("<QBQQ", raw[9:_FIXED])
        if version != 1:
            raise ValueError(f"{idx}: index version {version}; Megatron writes version 1")
        if code not in DTYPES:
            raise ValueError(f"{idx}: unknown dtype code {code} (Megatron's codes are 1 to 8)")
        self.dtype = np.dtype(DTYPES[code])
        need = _FIXED + 4 * n + 8 * n + 8 * d
        if len(raw) not in (need, need + n):
            state = "truncated" if len(raw) < need else "has extra bytes"
            raise ValueError(f"{idx}: {state}: {len(raw)} bytes, expected {need} for {n} sequences "
                             f"and {d} document indices (or {need + n} with sequence modes)")
        self.sequence_lengths = np.frombuffer(raw, np.int32, n, _FIXED)
        self.sequence_pointers = np.frombuffer(raw, np.int64, n, _FIXED + 4 * n)
        self.document_indices = np.frombuffer(raw, np.int64, d, _FIXED + 12 * n)
        self.sequence_modes = np.frombuffer(raw, np.int8, n, need) if len(raw) == need + n and n else None
        if np.any(self.sequence_lengths < 0):
            raise ValueError(f"{idx}: negative sequence length at {int(np.argmax(self.sequence_lengths < 0))}")
        starts = np.concatenate([[0], np.cumsum(self.sequence_lengths, dtype=np.int64)[:-1]])
        bad = np.flatnonzero(self.sequence_pointers != starts * self.dtype.itemsize)
        if bad.size:
            raise ValueError(f"{idx}: sequence {bad[0]} points to byte {self.sequence_pointers[bad[0]]}, "
                             f"but the lengths before it put it at {starts[bad[0]] * self.dtype.itemsize}")
        _check_documents(self.document_indices, n, str(idx))
        total = int(self.sequence_lengths.sum(dtype=np.int64)) * self.dtype.itemsize
        size = os.path.getsize(bin_)
        if size != total:
            state = "truncated" if size < total else "has extra bytes"
            raise ValueError(f"{bin_}: {state}: {size} bytes, the index ({idx.name}) needs {total} "
                             f"({int(total // self.dtype.itemsize)} tokens of {self.dtype.name})")
        self.bin_path, self.bin_bytes = bin_, total
        self.tokens = (np.memmap(bin_, dtype=self.dtype, mode="r") if total
                       else np.zeros(0, self.dtype))

    def check_size(self) -> None:
        """The .bin still has the size the index gives (a mapped page past a shrunk file's end
        would be a SIGBUS, not an exception); a ValueError naming the file otherwise."""
        size = os.path.getsize(self.bin_path)
        if size != self.bin_bytes:
            raise ValueError(f"{self.bin_path}: now {size} bytes, {self.bin_bytes} when opened (the index "
                             f"needs that many): the file changed while in use")

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        start = self.sequence_pointers[i] // self.dtype.itemsize
        return self.tokens[start:start + self.sequence_lengths[i]]

    def documents(self) -> list:
        """Each document's tokens (its sequences concatenated)."""
        d = self.document_indices
        return [np.concatenate(self[int(d[j]):int(d[j + 1])] or [np.zeros(0, self.dtype)])
                for j in range(len(d) - 1)]


def read_indexed_dataset(prefix) -> IndexedDataset:
    """Open ``prefix.bin``/``prefix.idx`` (checked; see IndexedDataset)."""
    return IndexedDataset(prefix)


class GPTSamples:
    """Megatron GPTDataset's document, sample and shuffle indices for one file (see module doc)."""

    def __init__(self, dataset: IndexedDataset, seq_length: int, seed: int, num_samples=None):
        n, lengths = len(dataset), dataset.sequence_lengths.astype(np.int64)
        tokens_per_epoch = int(lengths.sum())
        if seq_length < 2 or tokens_per_epoch < 2:
            raise ValueError(f"seq_length {seq_length} and {tokens_per_epoch} tokens: need >= 2 of each")
        epochs = 1
        if num_samples is not None:  # GPTDataset._get_num_epochs
            while epochs * tokens_per_epoch < num_samples * seq_length + 1:
                epochs += 1
        separate = False
        if epochs > 1:  # GPTDataset._build_document_sample_shuffle_indices
            sans_final = ((epochs - 1) * tokens_per_epoch - 1) // seq_length
            per_epoch = (tokens_per_epoch - 1) // seq_length
            separate = num_samples - sans_final < int(0.80 * per_epoch)
        rng = np.random.RandomState(seed)
        self.document_index = _document_index(np.arange(n), epochs, rng, separate)
        self.num_samples = (epochs * tokens_per_epoch - 1) // seq_length   # drop the partial last
        first = sans_final if separate else self.num_samples
        self.shuffle_index = np.concatenate([_shuffled(0, first, rng),
                                             _shuffled(first, self.num_samples, rng)])
        self.starts = np.concatenate([[0], np.cumsum(lengths[self.document_index])])
        self.dataset, self.seq_length = dataset, seq_length

    def sample(self, k: int) -> np.ndarray:
        """Unshuffled sample k: stream tokens [k*s, k*s + s + 1) across document boundaries."""
        lo, hi = k * self.seq_length, (k + 1) * self.seq_length + 1
        j = int(np.searchsorted(self.starts, lo, side="right")) - 1
        parts = []
        while lo < hi:
            seq = self.dataset[int(self.document_index[j])]
            take = seq[lo - self.starts[j]:hi - self.starts[j]]
            parts.append(take)
            lo, j = lo + len(take), j + 1
        return np.concatenate(parts).astype(np.int64)


def _document_index(docs, epochs, rng, separate):
    if not separate or epochs == 1:
        index = np.tile(docs, epochs).astype(np.int32)
        rng.shuffle(index)
        return index
    return np.concatenate([_document_index(docs, epochs - 1, rng, False),
                           _document_index(docs, 1, rng, False)])


def _shuffled(lo, hi, rng):
    index = np.arange(lo, hi, dtype=np.uint32)
    if hi > lo:
        rng.shuffle(index)
    return index


_CACHE: dict = {}  # the last GPTSamples built (a training run asks for the same one every step)


def _samples(dataset, seq_length: int, seed: int, num_samples) -> GPTSamples:
    given = dataset if isinstance(dataset, IndexedDataset) else None
    idx = Path(f"{dataset}.idx")
    where = id(given) if given is not None else (str(idx.resolve()),
                                                 idx.stat().st_mtime_ns if idx.exists() else None)
    key = (where, seq_length, seed, num_samples)
    hit = _CACHE.get(key)
    if hit is None or (given is not None and hit.dataset is not given):
        hit = GPTSamples(given or read_indexed_dataset(dataset), seq_length, seed, num_samples)
        _CACHE.clear()
        _CACHE[key] = hit
    return hit


def get_batch(dataset, iteration: int, global_batch_size: int, seq_length: int, seed: int = 0,
              num_samples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``iteration`` (from 0): (inputs, labels), int64 [global_batch_size,
    seq_length], like ``labkit.data.get_batch`` but from a .bin/.idx (a prefix or an IndexedDataset).
    ``seed`` is Megatron's ``--seed`` (its default is 1234); ``num_samples`` its train_iters x gbs
    (None: one epoch, enough for ``(tokens - 1) // seq_length`` samples)."""
    samples = _samples(dataset, seq_length, seed, num_samples)
    ds = samples.dataset
    ds.check_size()                                                 # before touching mapped pages
    first = iteration * global_batch_size
    if first + global_batch_size > samples.num_samples:
        raise ValueError(f"iteration {iteration} needs samples up to {first + global_batch_size}; "
                         f"{ds.prefix} gives {samples.num_samples} of length {seq_length} "
                         f"(pass num_samples = train_iters * global_batch_size for more epochs)")
    rows = [samples.sample(int(samples.shuffle_index[i]))
            for i in range(first, first + global_batch_size)]
    window = torch.from_numpy(np.stack(rows))                       # [gbs, s + 1]
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


def make_tinyshakespeare_dataset(prefix=None) -> str:
    """Regenerate the shipped ``data/indexed/tinyshakespeare_text_document.{bin,idx}``: the corpus
    cut into speeches (a speech ends after its blank line), byte tokens, one sequence per document,
    uint16 (Megatron's choice for a 256-token vocabulary). Returns the prefix."""
    from .data import CORPUS, DATA_DIR, ByteTokenizer
    prefix = str(DATA_DIR / "indexed" / "tinyshakespeare_text_document") if prefix is None else str(prefix)
    text = CORPUS.read_text(encoding="utf-8")
    speeches = [s + "\n\n" for s in text.split("\n\n")]
    speeches[-1] = speeches[-1][:-2]                                # the corpus ends with one "\n"
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    tok = ByteTokenizer()
    write_indexed_dataset(prefix, [np.array(tok.encode(s)) for s in speeches], np.uint16)
    return prefix
