"""What autograd keeps for the backward, measured and itemized (chapters "Tensor parallelism",
"Sequence parallelism", "Pipeline parallelism").

* :func:`saved_activations` - run a function and record every storage autograd saves
  (``saved_tensors_hooks``), each storage once, parameters excluded;
* :func:`labkit_layer_activation_bytes` - the same count, itemized, for labkit's transformer layer,
  to set next to Korthikanti et al. 2022's formula (``labkit.calc.memory.activation_bytes_per_layer``);
* :func:`korthikanti_gaps` - each difference between the two, one reason per entry;
* :class:`SavedTensorMeter` - the same count attached to a pipeline schedule's forwards
  (``PipelineRunner.meters``): the most bytes held at once, and what one microbatch saves per chunk.
  Nothing counts unless a caller attaches it: the training path pays nothing.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch


@dataclass
class SavedActivations:
    """Tensors autograd saved for the backward during one forward, one entry per storage."""

    storages: dict = field(default_factory=dict)   # data_ptr -> (nbytes, shape of the first saver)

    @property
    def total_bytes(self) -> int:
        return sum(n for n, _ in self.storages.values())

    def table(self) -> list[tuple[int, tuple]]:
        """[(nbytes, shape)], largest first: what holds the memory."""
        return sorted(self.storages.values(), key=lambda r: -r[0])


def saved_activations(fn, *args, exclude=()) -> tuple[SavedActivations, object]:
    """Run ``fn(*args)`` and record every storage autograd saves (``saved_tensors_hooks``).

    Storages are counted once each, whole (a view saved by several ops counts once), parameters
    (``exclude``) not at all. Returns (SavedActivations, fn's output); the output keeps the graph
    alive, so the counted storages are still held when this returns.
    """
    skip = {p.untyped_storage().data_ptr() for p in exclude}
    rec = SavedActivations()

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip and ptr not in rec.storages:
            rec.storages[ptr] = (t.untyped_storage().nbytes(), tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return rec, out


class SavedTensorMeter:
    """Attach to a ``PipelineRunner`` (``runner.meters.append(SavedTensorMeter())``): each forward
    of (chunk, microbatch) records the storages autograd saves (parameters excluded), held until the
    executor releases them after the backward; at the end of a schedule it fills the run's
    ``peak_activation_bytes`` and ``activation_bytes`` {chunk: bytes one microbatch saves}."""

    def __init__(self):
        self.held, self.peak, self.sizes, self.per_chunk = 0, 0, {}, {}

    @contextlib.contextmanager
    def forward(self, chunk, c: int, mb: int):
        params = {p.untyped_storage().data_ptr() for p in chunk.parameters()}
        seen: dict[int, int] = {}

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:
                seen[ptr] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        self.sizes[(c, mb)] = self.per_chunk[c] = sum(seen.values())
        self.held += self.sizes[(c, mb)]
        self.peak = max(self.peak, self.held)

    def release(self, c: int, mb: int) -> None:
        self.held -= self.sizes.pop((c, mb))

    def finish(self, run) -> None:
        run.peak_activation_bytes, run.activation_bytes = self.peak, dict(self.per_chunk)
        self.held, self.peak, self.sizes, self.per_chunk = 0, 0, {}, {}


def labkit_layer_activation_bytes(seq_length, micro_batch_size, hidden_size, num_attention_heads,
                                  tp=1, sequence_parallel=False, bytes_per_element=4,
                                  regather=False) -> dict:
    """What labkit's TransformerLayer saves on one TP rank, itemized (dropout 0, ffn = 4h).

    Korthikanti et al. 2022 count the same tensors in 16-bit plus the dropout masks and outputs;
    the differences are the subject of the chapter's table. Under SP, labkit keeps the all-gathered
    [b, s, h] inputs of linear_qkv and linear_fc1 (autograd saves the gathered tensor); Megatron
    keeps the [b, s/t, h] shard and all-gathers it again in the backward (``regather=True``: labkit's
    advanced variant, :func:`use_regather`).
    """
    s, b, h, a, t, e = seq_length, micro_batch_size, hidden_size, num_attention_heads, tp, bytes_per_element
    sp = sequence_parallel and t > 1
    sbh, shard = s * b * h, (t if sp else 1)
    return {
        "layer norm inputs (2)": 2 * sbh * e / shard,
        "layer norm mean and rstd (2 x 2)": 4 * s * b * e / shard,
        "linear_qkv and linear_fc1 inputs": 2 * sbh * e / (t if sp and regather else 1),  # gathered
        "Q, K, V": 3 * sbh * e / t,
        "softmax output": b * a * s * s * e / t,
        "causal mask (bool)": s * s,
        "linear_proj input": sbh * e / t,
        "GeLU input": 4 * sbh * e / t,
        "linear_fc2 input": 4 * sbh * e / t,
    }


def korthikanti_gaps(seq_length, micro_batch_size, hidden_size, num_attention_heads, tp=1,
                     sequence_parallel=False, regather=False) -> dict:
    """Bytes (16-bit accounting) to ADD to labkit's count to get Korthikanti et al.'s per-layer count.

    ``labkit_layer_activation_bytes(..., bytes_per_element=2) + sum(gaps) ==
    labkit.calc.memory.activation_bytes_per_layer(...)`` exactly; each entry is one reason.
    """
    s, b, h, a, t = seq_length, micro_batch_size, hidden_size, num_attention_heads, tp
    sp = sequence_parallel and t > 1
    sbh, shard = s * b * h, (t if sp else 1)
    gaps = {
        "dropout masks after attention and MLP (1 byte; labkit: dropout 0)": 2 * sbh / shard,
        "attention dropout mask (1 byte; labkit: dropout 0)": a * s * s * b / t,
        "attention dropout output (labkit: dropout 0, softmax output used directly)": 2 * a * s * s * b / t,
        "layer norm mean and rstd (labkit counts them; the paper does not)": -4 * s * b * 2 / shard,
        "causal mask (labkit builds it per call; the paper does not count it)": -s * s,
    }
    if sp and not regather:
        gaps["linear_qkv/linear_fc1 inputs: labkit keeps them gathered, Megatron re-gathers"] = \
            -2 * sbh * 2 * (1 - 1 / t)
    return gaps
