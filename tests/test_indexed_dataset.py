"""labkit.indexed_dataset: Megatron's .bin/.idx format and GPTDataset's sampling for one file.

References, independent of the code under test: the .idx bytes are packed by hand below from the
layout of megatron/core/datasets/indexed_dataset.py @ d98e8a64 (_IndexWriter.write); the sampler
is compared with a line-by-line transcription of helpers.cpp's build_sample_idx and of
GPTDataset._query_document_sample_shuffle_indices (same commit). (Checked once more against
Megatron's own IndexedDataset, IndexedDatasetBuilder and GPTDataset at that commit, which CI cannot
import: identical bytes and identical batches; see data/README.md.)
"""
import struct

import numpy as np
import pytest
import torch

from labkit import data
from labkit.indexed_dataset import (get_batch, make_tinyshakespeare_dataset, read_indexed_dataset,
                                    write_indexed_dataset)

SHIPPED = data.DATA_DIR / "indexed" / "tinyshakespeare_text_document"


def test_idx_bytes_are_megatrons_layout(tmp_path):
    p = str(tmp_path / "x")
    write_indexed_dataset(p, [[5, 6, 7], [], [8]], np.int32, document_indices=[0, 2, 3])
    expected = (b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 4)   # int32 = code 4
                + struct.pack("<Q", 3) + struct.pack("<Q", 3)                      # 3 seqs, 3 doc idx
                + struct.pack("<3i", 3, 0, 1)                                     # lengths
                + struct.pack("<3q", 0, 12, 12)                                   # byte pointers
                + struct.pack("<3q", 0, 2, 3))                                    # document indices
    assert (tmp_path / "x.idx").read_bytes() == expected
    assert (tmp_path / "x.bin").read_bytes() == struct.pack("<4i", 5, 6, 7, 8)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float64,
                                   np.float32, np.uint16])
def test_round_trip_every_megatron_dtype(tmp_path, dtype):
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 100, int(rng.integers(0, 20))).astype(dtype) for _ in range(9)]
    write_indexed_dataset(tmp_path / "d", seqs, dtype, sequence_modes=list(range(9)))
    ds = read_indexed_dataset(tmp_path / "d")
    assert len(ds) == 9 and ds.dtype == np.dtype(dtype)
    assert all(np.array_equal(a, b) for a, b in zip(ds, seqs))
    assert list(ds.document_indices) == list(range(10)) and list(ds.sequence_modes) == list(range(9))
    assert isinstance(ds.tokens, np.memmap)


def test_documents_of_several_sequences(tmp_path):
    write_indexed_dataset(tmp_path / "d", [[1], [2, 3], [4]], np.uint16, document_indices=[0, 2, 3])
    docs = read_indexed_dataset(tmp_path / "d").documents()
    assert [d.tolist() for d in docs] == [[1, 2, 3], [4]]


def test_refuses_to_write_what_it_cannot_store(tmp_path):
    with pytest.raises(ValueError, match="outside uint8's range"):
        write_indexed_dataset(tmp_path / "d", [[1, 256]], np.uint8)
    with pytest.raises(ValueError, match="no Megatron code"):
        write_indexed_dataset(tmp_path / "d", [[1]], np.uint32)
    with pytest.raises(ValueError, match="document indices must rise from 0"):
        write_indexed_dataset(tmp_path / "d", [[1], [2]], np.uint16, document_indices=[0, 1])


def _corrupt(tmp_path, edit_idx=None, edit_bin=None):
    p = tmp_path / "c"
    write_indexed_dataset(p, [[1, 2, 3], [4, 5]], np.uint16)
    idx, bin_ = tmp_path / "c.idx", tmp_path / "c.bin"
    if edit_idx:
        idx.write_bytes(edit_idx(idx.read_bytes()))
    if edit_bin:
        bin_.write_bytes(edit_bin(bin_.read_bytes()))
    return p


@pytest.mark.parametrize("edit_idx, edit_bin, file, message", [
    (lambda b: b"NOTANIDX\x00" + b[9:], None, "c.idx", "not a Megatron index file"),
    (lambda b: b[:9] + struct.pack("<Q", 2) + b[17:], None, "c.idx", "index version 2"),
    (lambda b: b[:17] + bytes([9]) + b[18:], None, "c.idx", "unknown dtype code 9"),
    (lambda b: b[:20], None, "c.idx", "truncated header"),
    (lambda b: b[:-5], None, "c.idx", "truncated: 77 bytes, expected 82"),
    (lambda b: b + b"\x00" * 7, None, "c.idx", "has extra bytes"),
    (lambda b: b[:34] + struct.pack("<i", -3) + b[38:], None, "c.idx", "negative sequence length"),
    (lambda b: b[:42] + struct.pack("<q", 4) + b[50:], None, "c.idx", "sequence 0 points to byte 4"),
    (lambda b: b[:-8] + struct.pack("<q", 1), None, "c.idx", "document indices must rise from 0"),
    (None, lambda b: b[:-1], "c.bin", "truncated: 9 bytes, the index"),
    (None, lambda b: b + b"\x00\x00", "c.bin", "has extra bytes: 12 bytes"),
])
def test_corrupt_files_name_the_file_and_the_fault(tmp_path, edit_idx, edit_bin, file, message):
    p = _corrupt(tmp_path, edit_idx, edit_bin)
    with pytest.raises(ValueError, match=message) as err:
        read_indexed_dataset(p)
    assert str(tmp_path / file) in str(err.value)


def test_missing_half_of_the_pair(tmp_path):
    p = _corrupt(tmp_path)
    (tmp_path / "c.bin").unlink()
    with pytest.raises(FileNotFoundError, match="c.bin: no such file"):
        read_indexed_dataset(p)


def test_shipped_files_equal_a_fresh_regeneration(tmp_path):
    fresh = make_tinyshakespeare_dataset(tmp_path / "ts_text_document")
    for ext in ("bin", "idx"):
        assert (tmp_path / f"ts_text_document.{ext}").read_bytes() == \
            SHIPPED.with_name(SHIPPED.name + f".{ext}").read_bytes(), ext
    ds = read_indexed_dataset(fresh)
    assert len(ds) == 759 and ds.dtype == np.uint16          # one document per speech
    assert bytes(ds[0].tolist()) == b"First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    assert np.array_equal(np.concatenate(list(ds)), data.load_tokens().numpy())   # the corpus, whole


# --- the sampler, against a transcription of Megatron's own loops ---------------------------------

def _megatron_sample_idx(sizes, doc_idx, s, epochs, tokens_per_epoch):
    """helpers.cpp build_sample_idx (drop_last_partial_sequence, add_extra_token_to_sequence=1)."""
    num_samples = (epochs * tokens_per_epoch - 1) // s
    out, d, off = [(0, 0)], 0, 0
    while len(out) <= num_samples:
        remaining = s + 1
        while remaining != 0:
            length = sizes[doc_idx[d]] - off
            remaining -= length
            if remaining <= 0:
                off += remaining + length - 1
                remaining = 0
            else:
                if d == len(doc_idx) - 1:
                    off = sizes[doc_idx[d]] - 1
                    break
                d, off = d + 1, 0
        out.append((d, off))
    return out


def _megatron_batch(ds, it, gbs, s, seed, num_samples):
    """GPTDataset (one file, all sequences) + MegatronPretrainingSampler, as written at d98e8a64."""
    sizes, n = ds.sequence_lengths, len(ds)
    tokens = int(sizes.sum())
    epochs = 1
    while num_samples is not None and epochs * tokens < num_samples * s + 1:
        epochs += 1
    sans = ((epochs - 1) * tokens - 1) // s
    separate = epochs > 1 and num_samples - sans < int(0.80 * ((tokens - 1) // s))
    rng = np.random.RandomState(seed)

    def doc_index(e):
        x = np.mgrid[0:e, 0:n][1].reshape(-1).astype(np.int32)
        rng.shuffle(x)
        return x
    doc_idx = (np.concatenate([doc_index(epochs - 1), doc_index(1)]) if separate else doc_index(epochs))
    sample_idx = _megatron_sample_idx(sizes, doc_idx, s, epochs, tokens)
    total = len(sample_idx) - 1
    first = np.arange(sans if separate else total, dtype=np.uint32)
    rng.shuffle(first)
    shuffle = first
    if separate:
        last = np.arange(sans, total, dtype=np.uint32)
        rng.shuffle(last)
        shuffle = np.concatenate([first, last])
    rows = []
    for i in range(it * gbs, (it + 1) * gbs):
        k = shuffle[i]
        (b, b_off), (e, e_off) = sample_idx[k], sample_idx[k + 1]
        if b == e:
            parts = [ds[doc_idx[b]][b_off:e_off + 1]]
        else:
            parts = [ds[doc_idx[j]][(b_off if j == b else 0):(None if j < e else e_off + 1)]
                     for j in range(b, e + 1)]
        rows.append(np.concatenate(parts).astype(np.int64))
    text = torch.from_numpy(np.stack(rows))
    return text[:, :-1], text[:, 1:]


@pytest.mark.parametrize("seq, seed, num_samples, gbs, iterations", [
    (8, 1234, None, 2, range(0, 3)),        # one epoch: (49 - 1) // 8 = 6 samples
    (5, 3, 60, 6, range(0, 10)),           # 7 epochs, the last one shuffled separately
    (7, 0, 11, 5, range(0, 2)),            # two epochs in one shuffle (final epoch 5 >= 0.8 * 6)
])
def test_batches_equal_megatrons_gpt_dataset(tmp_path, seq, seed, num_samples, gbs, iterations):
    rng = np.random.default_rng(1)
    lengths = [0, 1, 13, 2, 9, 0, 4, 17, 3]                 # empty and one-token documents too
    write_indexed_dataset(tmp_path / "t", [rng.integers(0, 256, n) for n in lengths], np.uint16)
    ds = read_indexed_dataset(tmp_path / "t")
    for it in iterations:
        x, y = get_batch(ds, it, gbs, seq, seed=seed, num_samples=num_samples)
        ref_x, ref_y = _megatron_batch(ds, it, gbs, seq, seed, num_samples)
        assert torch.equal(x, ref_x) and torch.equal(y, ref_y), it


def test_batch_has_labkit_get_batch_shape_and_packs_across_documents():
    x, y = get_batch(str(SHIPPED), 3, 8, 64, seed=1234)
    ref_x, _ = data.get_batch(data.load_tokens(), 3, 8, 64, 1234)
    assert x.shape == y.shape == ref_x.shape and x.dtype == y.dtype == ref_x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])                  # labels: inputs shifted by one
    assert not torch.equal(x, get_batch(str(SHIPPED), 3, 8, 64, seed=1)[0])


def test_asking_past_the_built_samples_says_how_to_get_more(tmp_path):
    write_indexed_dataset(tmp_path / "t", [list(range(50))], np.uint16)
    with pytest.raises(ValueError, match="gives 6 of length 8 .*num_samples"):
        get_batch(str(tmp_path / "t"), 1, 4, 8)
    x, _ = get_batch(str(tmp_path / "t"), 1, 4, 8, num_samples=8)
    assert x.shape == (4, 8)


def test_a_bin_truncated_while_mapped_is_a_value_error_not_sigbus(tmp_path):
    """The size is checked against the index before mapping and before every batch (issue 24);
    only a truncation between that check and the read stays a SIGBUS (module docstring)."""
    prefix = str(tmp_path / "d")
    write_indexed_dataset(prefix, [np.arange(500) % 256, np.arange(300) % 256], np.uint16)
    ds = read_indexed_dataset(prefix)
    get_batch(ds, 0, 2, 16, seed=1)                                   # mapped and read once
    with open(prefix + ".bin", "r+b") as f:
        f.truncate(100)                                              # under the map
    with pytest.raises(ValueError, match=r"d\.bin: now 100 bytes, 1600 when opened .* changed while in use"):
        get_batch(ds, 1, 2, 16, seed=1)
    with pytest.raises(ValueError, match=r"d\.bin: truncated: 100 bytes, the index \(d\.idx\) needs 1600"):
        read_indexed_dataset(prefix)                                  # and before mapping
