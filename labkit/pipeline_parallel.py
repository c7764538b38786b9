"""Pipeline parallelism: cut the dense GPT into stages and run any schedule on them.

Chapters "Pipeline parallelism" and "Interleaved pipeline" (Narayanan et al., 2021, Sec. 2.2).

* :class:`PipelineStage` - virtual stage s of S: a contiguous block of the dense model's layers,
  plus the embedding on stage 0 and the final norm, output layer and loss on stage S-1. With v
  chunks per rank, rank r holds stages r, r+p, ..., r+(v-1)p, Megatron-LM's placement.
* :func:`run_schedule` - the one executor: runs a rank's action list (``labkit.schedules``),
  receiving activations / gradients just before the action that needs them and sending results
  as soon as they exist, and records an ``Event`` (start, end in seconds) per action, so the
  real run is drawn with the same ``render()`` as the simulated one.
* :class:`PipelineRunner` - the ``labkit.parallelize`` runner contract for
  ``pipeline_model_parallel_size > 1``: 1F1B, or interleaved 1F1B when
  ``num_layers_per_virtual_pipeline_stage`` is set; after backward the tied word-embedding
  gradient is summed over the "embedding group" (first and last stage), as Megatron does.

Point-to-point: a tensor travels as a small header (dtype, shape) then its data, so shapes may
differ between messages. Sends are non-blocking (``isend``) and tagged with (kind, stage,
microbatch): a blocking send would deadlock 1F1B, where neighbours send to each other at once
(Megatron avoids that with batched ``send_forward_recv_backward``). gloo matches tags, so
messages may arrive in any order (``comm.send(..., tag=, wait=False)``, ``comm.recv(..., tag=)``);
bytes are counted on the group's stats like every other op. NCCL ignores tags (it
matches p2p messages between two ranks in order), so this executor is tested on gloo only.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from . import comm
from .groups import Group, new_group
from .model import lm_loss
from .schedule_sim import Event
from .schedules import Action, interleaved, one_f_one_b, virtual_chunks
from .topology import Topology


# ---------------------------------------------------------------------------------------------
class PipelineStage(nn.Module):
    """Virtual stage ``stage`` of ``num_stages``: layers [stage*L/S, (stage+1)*L/S) of ``model``.

    Parameter names equal the dense model's (``decoder.layers.5.mlp.linear_fc1.weight``), except
    the last stage's copy of a tied output weight, ``output_layer.weight`` (Megatron's name too).
    """

    def __init__(self, model, stage: int, num_stages: int):
        super().__init__()
        n = model.cfg.num_layers // num_stages
        self.stage, self.is_first, self.is_last = stage, stage == 0, stage == num_stages - 1
        tied = model.output_layer is None and num_stages > 1  # two copies: sum their grads
        if self.is_first:
            self.embedding = model.embedding
            self.embedding.word_embeddings.weight.shared_embedding = tied
        self.decoder = nn.Module()
        self.decoder.layers = nn.ModuleDict(
            {str(i): model.decoder.layers[i] for i in range(stage * n, (stage + 1) * n)})
        if self.is_last:
            self.decoder.final_layernorm = model.decoder.final_layernorm
            if model.output_layer is not None:
                self.output_layer = model.output_layer
            elif not self.is_first:  # tied: the last stage keeps its own copy of the embeddings
                weight = model.embedding.word_embeddings.weight
                self.output_layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False,
                                              device=weight.device, dtype=weight.dtype)
                with torch.no_grad():
                    self.output_layer.weight.copy_(weight)
                self.output_layer.weight.shared_embedding = tied

    def output_weight(self) -> torch.Tensor:
        """[V, h]: the output layer, or the embeddings themselves when one stage holds both."""
        if hasattr(self, "output_layer"):
            return self.output_layer.weight
        return self.embedding.word_embeddings.weight

    def forward(self, x, labels=None):
        """First stage: tokens [b, s]; others: hidden [b, s, h]. Last returns the mean loss."""
        if self.is_first:
            x = self.embedding(x)                           # [b, s] -> [b, s, h]
        for layer in self.decoder.layers.values():
            x = layer(x)                                    # [b, s, h]
        if not self.is_last:
            return x
        x = self.decoder.final_layernorm(x)
        return lm_loss(x @ self.output_weight().t(), labels)  # logits [b, s, V] -> scalar


def dense_name(name: str) -> str:
    """The dense model's name for a stage parameter (the tied output copy maps to the embedding)."""
    return "embedding.word_embeddings.weight" if name == "output_layer.weight" else name


# ---------------------------------------------------------------------------------------------
def _tag(kind: str, stage: int, mb: int) -> int:
    """Unique even tag per message: (F activation | B gradient, receiving stage, microbatch)."""
    return (("FB".index(kind) * 256 + stage) * 65536 + mb) * 2  # +1 for the data after the header


# ---------------------------------------------------------------------------------------------
@dataclass
class ScheduleRun:
    """What :func:`run_schedule` returns for one rank and one iteration."""

    loss_sum: float                      # sum over microbatches of loss / m (last stage), else 0
    events: list[Event] = field(default_factory=list)   # seconds since ``t0``
    peak_activation_bytes: int = 0       # most bytes saved for backward held at once
    peak_in_flight: int = 0              # most microbatch-chunks held at once
    activation_bytes: dict = field(default_factory=dict)  # chunk -> bytes one microbatch saves


def _saved_bytes(stage: nn.Module):
    """A saved-tensor hook that adds up the storages autograd keeps (parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in stage.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t
    return seen, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)


def run_schedule(actions, stages: dict, group: Group, microbatches, dp=None,
                 t0: float | None = None) -> ScheduleRun:
    """Run this rank's ``actions`` on its ``stages`` ({chunk: PipelineStage}).

    ``microbatches``: [(tokens, labels)] for this data-parallel rank (every pipeline rank gets
    the list; only the first stage reads tokens, only the last reads labels). ``dp``: the data-
    parallel object whose ``grad_sync_context`` wraps each backward (None: no DP). Each loss is
    divided by m, so gradients accumulate to those of the mean loss over the global batch.
    """
    p, r, m, dev = group.size, group.rank, len(microbatches), microbatches[0][0].device
    t0 = time.perf_counter() if t0 is None else t0
    uses_w = any(a.kind == "W" for a in actions)
    last_bwd = max(i for i, a in enumerate(actions) if a.kind == ("W" if uses_w else "B"))
    saved, sends, run = {}, [], ScheduleRun(0.0)
    held_bytes, sizes = 0, {}
    for i, a in enumerate(actions):
        sends = [(q, t) for q, t in sends if not q.is_completed()]  # free delivered buffers
        c, mb = a.chunk, a.microbatch
        s, stage = c * p + r, stages[c]
        sync = dp.grad_sync_context(i == last_bwd) if dp is not None else contextlib.nullcontext()
        if a.kind == "F":
            if s == 0:
                x = microbatches[mb][0]
            else:  # activation of stage s-1, from the rank that holds it
                x = comm.recv(group, (s - 1) % p, dev, tag=_tag("F", s, mb)).requires_grad_()
            start = time.perf_counter()
            seen, hooks = _saved_bytes(stage)
            with hooks:
                out = stage(x, microbatches[mb][1]) if stage.is_last else stage(x)
            if stage.is_last:
                out = out / m                               # mean over the global batch
                run.loss_sum += out.item()
            else:
                sends += comm.send(group, out, (s + 1) % p, tag=_tag("F", s + 1, mb), wait=False)
            saved[(mb, c)] = (x, out, None)
            sizes[(mb, c)] = run.activation_bytes[c] = sum(seen.values())
            held_bytes += sizes[(mb, c)]
        else:
            x, out, grad = saved[(mb, c)]
            if a.kind == "B" and not stage.is_last:  # gradient of our output, from stage s+1
                grad = comm.recv(group, (s + 1) % p, dev, tag=_tag("B", s, mb))
                saved[(mb, c)] = (x, out, grad)      # W (if any) needs it again
            start = time.perf_counter()
            with sync:
                if a.kind == "B" and uses_w:                # input gradient only, keep the graph
                    if s > 0:
                        torch.autograd.backward(out, grad, inputs=[x], retain_graph=True)
                elif a.kind == "W":                         # weight gradients
                    torch.autograd.backward(out, grad, inputs=list(stage.parameters()))
                else:                                       # whole backward at once
                    torch.autograd.backward(out, grad)
            if a.kind == "B" and s > 0:
                sends += comm.send(group, x.grad, (s - 1) % p, tag=_tag("B", s - 1, mb), wait=False)
            if a.kind == ("W" if uses_w else "B"):          # activations of (mb, c) are freed
                del saved[(mb, c)]
                held_bytes -= sizes.pop((mb, c))
        run.events.append(Event(r, a, start - t0, time.perf_counter() - t0))
        run.peak_activation_bytes = max(run.peak_activation_bytes, held_bytes)
        run.peak_in_flight = max(run.peak_in_flight, len(saved))
    for req, _ in sends:
        req.wait()
    return run


# ---------------------------------------------------------------------------------------------
def embedding_group(world_size: int, groups: dict) -> Group | None:
    """Megatron's embedding group: first and last pipeline rank of each pp group.

    Every rank takes part in creating every group (torch.distributed requires it); returns the
    one holding this rank, or None on middle stages.
    """
    topo = Topology(world_size, tp=groups["tp"].size, pp=groups["pp"].size,
                    cp=groups["cp"].size, ep=groups["ep"].size)
    mine, me = None, dist.get_rank()
    for ranks in topo.groups("pp"):
        if len(ranks) == 1:  # one stage holds both ends: nothing to sum
            continue
        g = new_group("embedding", [ranks[0], ranks[-1]])
        if me in (ranks[0], ranks[-1]):
            mine = g
    return mine


class PipelineRunner:
    """``labkit.parallelize`` runner for pp > 1: this rank's stages and the schedule that runs them.

    ``schedule``: None -> 1F1B (interleaved 1F1B when v > 1); or a builder ``f(p, m)`` from
    ``labkit.schedules`` (gpipe, zb_h1) to compare schedules on the same model.
    """

    def __init__(self, model, groups: dict, cfg, schedule=None):
        self.groups, self.pp = groups, groups["pp"]
        p, r = self.pp.size, self.pp.rank
        self.v = virtual_chunks(cfg.num_layers, p, cfg.num_layers_per_virtual_pipeline_stage)
        self.stages = {c: PipelineStage(model, c * p + r, p * self.v) for c in range(self.v)}
        self.module = nn.ModuleDict({str(c): st for c, st in self.stages.items()})
        self.computes_loss = self.stages[self.v - 1].is_last
        self.schedule_fn = schedule
        self.embedding = embedding_group(dist.get_world_size(), groups)
        self.last_run: ScheduleRun | None = None

    def named_parameters(self):
        return list(self.module.named_parameters())

    def actions(self, m: int) -> list[Action]:
        p = self.pp.size
        if self.schedule_fn is not None:
            return self.schedule_fn(p, m)[self.pp.rank]
        if self.v > 1:
            return interleaved(p, self.v, m)[self.pp.rank]
        return one_f_one_b(p, m)[self.pp.rank]

    def forward_backward(self, microbatches, dp, t0: float | None = None) -> float:
        self.last_run = run_schedule(self.actions(len(microbatches)), self.stages, self.pp,
                                     microbatches, dp, t0)
        return self.last_run.loss_sum

    @torch.no_grad()
    def finalize_model_grads(self) -> None:
        """Sum the two copies' gradients of the tied word embeddings over the embedding group."""
        from .parallelize import all_reduce_sequence_parallel_grads
        for st in self.stages.values():
            all_reduce_sequence_parallel_grads(st, self.groups.get("tp"))
        if self.embedding is None or self.embedding.size == 1:
            return
        for st in self.stages.values():  # first stage: embeddings; last stage: its copy
            for p in st.parameters():
                if getattr(p, "shared_embedding", False):
                    p.grad = comm.all_reduce(self.embedding, p.grad)
