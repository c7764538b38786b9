"""Fingerprints of a run, keyed by (iteration, phase, microbatch, layer, tensor) and rank coordinates.

Chapter "When training goes wrong", section "The first divergence". Two probes, one per side:

* :class:`Recording` (``labkit.train(probe=Recording())``), on every rank: the weights at the start
  of each iteration and the gradients after they are finished (``Engine.finalize_grads``), each
  with its shard-plan entry (which dense rows or columns it holds); per microbatch and layer, the
  forward activations (embedding, each layer's self_attention, mlp and output, the final norm) and
  the backward gradients reaching them, each with the samples and sequence positions it holds
  (data-parallel rank and microbatch; sequence and context parallelism's positions). With
  ``trace`` it also records every collective (``trace.Tracer``). A planted bug (``bugs.BUGS``) is
  applied first, on the ranks it names.
* :class:`ReferenceRecording` (``train_reference(probe=ReferenceRecording)``): the same tensors of
  the single-device model, whole: [global batch, s, h] activations, dense weights and gradients.

``compare.py`` cuts each reference tensor as the rank's record says (the shard plan's blocks,
its samples, its positions) and compares. A parallel run's activation gradients are dp x cp times
the reference's (each rank's loss is a mean over its own tokens): the record carries that scale.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

PHASES = ("weights", "forward", "backward", "grads", "step")
SUBLAYERS = ("self_attention", "mlp")


def layer_of(name: str) -> str:
    """The dense module a parameter or activation belongs to: "embedding", "decoder.layers.3",
    "decoder.final_layernorm", "output_layer"."""
    parts = name.split(".")
    if name.startswith("decoder.layers."):
        return ".".join(parts[:3])
    if name.startswith("decoder.final_layernorm"):
        return "decoder.final_layernorm"
    return parts[0]


def layer_position(layer: str | None, num_layers: int) -> float:
    """Forward order of a layer label (None: before everything in its phase)."""
    if layer is None:
        return float("-inf")
    if layer.startswith("decoder.layers."):
        return int(layer.split(".")[2])
    return {"embedding": -1, "decoder.final_layernorm": num_layers, "output_layer": num_layers + 1}.get(layer, num_layers + 2)


@dataclass
class Fingerprint:
    """One tensor of one rank at one place of the run."""

    iteration: int
    phase: str                  # "weights" | "forward" | "backward" | "grads"
    microbatch: int | None      # this data-parallel rank's microbatch (forward / backward)
    layer: str
    tensor: str                 # "output", "self_attention", "mlp" (+ ".grad"), or a parameter name
    clock: int                  # the rank's event clock: orders it among its collectives
    value: torch.Tensor         # on the CPU
    entry: object = None        # weights / grads: the ShardPlan entry (how it was cut)
    samples: tuple | None = None    # activations: [start, stop) of the global batch
    positions: tuple | None = None  # activations: positions of the sequence it holds
    scale: float = 1.0          # the reference's value times this is what this rank should hold


class Recording:
    """``labkit.train(probe=Recording(bug=None, trace=True))``: see the module docstring."""

    def __init__(self, bug: str | None = None, trace: bool = True):
        self.bug, self.trace = bug, trace

    def __call__(self, engine, topo, groups, cfg):
        return RankRecording(engine, topo, groups, cfg, self.bug, self.trace)


class RankRecording:
    def __init__(self, engine, topo, groups, cfg, bug, trace):
        import torch.distributed as dist

        from .trace import Tracer
        self.engine, self.cfg, self.rank = engine, cfg, dist.get_rank()
        self.coords = dict(engine.coords)
        self.tp_rank, self.tp = self.coords["tp"], topo.tp
        self.scale = float(topo.dp * topo.cp)
        self.mbs, self.dp, self.dp_rank = cfg.micro_batch_size, topo.dp, self.coords["dp"]
        self.records, self.ctx, self._clock, self.it = [], [None, "weights", None, None], 0, 0
        if bug is not None:
            from .bugs import BUGS
            BUGS[bug].apply(engine, topo, groups, cfg)
        self.order = self._microbatch_order(engine, cfg.num_microbatches(topo))
        self.count = [0] * len(engine.runner.chunks)
        for c, chunk in enumerate(engine.runner.chunks):
            self._hook(c, chunk)
        self.tracer = Tracer(groups, context=lambda: tuple(self.ctx), clock=self.tick).install() if trace else None
        finalize = engine.finalize_grads

        def finalize_grads():
            self.ctx = [self.it, "grads", None, None]
            finalize()
            self._params("grads", engine.dp.full_grads)
            self.ctx = [self.it, "step", None, None]
        engine.finalize_grads = finalize_grads              # an instance attribute: this Engine only

    def tick(self) -> int:
        self._clock += 1
        return self._clock

    @staticmethod
    def _microbatch_order(engine, m: int) -> list[list[int]]:
        """Per chunk, the microbatch of its n-th forward in an iteration (the schedule's order)."""
        runner = engine.runner
        if hasattr(runner, "plan"):
            actions = runner.plan(m)[0]
            return [[a.microbatch for a in actions if a.kind == "F" and a.chunk == c] for c in range(len(runner.chunks))]
        return [list(range(m))]

    # -- probe interface ---------------------------------------------------------------------
    def begin(self, iteration: int) -> None:
        self.it, self.count = iteration, [0] * len(self.count)
        self.ctx = [iteration, "weights", None, None]
        self._params("weights", self.engine.dp.full_parameters)

    def end(self) -> dict:
        if self.tracer is not None:
            self.tracer.uninstall()
        return {"rank": self.rank, "coords": self.coords, "records": self.records,
                "collectives": self.tracer.records if self.tracer is not None else None}

    # -- recording ---------------------------------------------------------------------------
    def _params(self, phase: str, gather) -> None:
        if self.tracer is not None:
            self.tracer.quiet = True               # the probe's own gathers are not the run's
        try:
            full = gather()
        finally:
            if self.tracer is not None:
                self.tracer.quiet = False
        for name, t in full.items():
            entry = self.engine.plan[name]
            self.records.append(Fingerprint(self.it, phase, None, layer_of(entry.name), name, self.tick(),
                                            t.detach().cpu().clone(), entry=entry))

    def _positions(self, position_ids, local: int) -> tuple:
        base = list(range(self.cfg.seq_length)) if position_ids is None else [int(p) for p in position_ids.reshape(-1)]
        if len(base) != local:                     # sequence parallelism: my s/t of them
            base = base[self.tp_rank * local:(self.tp_rank + 1) * local]
        return tuple(base)

    def _activation(self, layer: str, tensor: str, out, position_ids) -> None:
        if not torch.is_tensor(out) or out.dim() != 3:
            return
        mb = self.ctx[2]
        start = mb * self.mbs * self.dp + self.dp_rank * self.mbs
        meta = dict(samples=(start, start + self.mbs), positions=self._positions(position_ids, out.shape[1]))
        self.records.append(Fingerprint(self.it, "forward", mb, layer, tensor, self.tick(),
                                        out.detach().cpu().clone(), **meta))
        if out.requires_grad:
            it = self.it

            def on_grad(g):
                self.ctx = [it, "backward", mb, layer]
                self.records.append(Fingerprint(it, "backward", mb, layer, tensor + ".grad", self.tick(),
                                                g.detach().cpu().clone(), scale=self.scale, **meta))
            out.register_hook(on_grad)

    def _hook(self, c: int, chunk) -> None:
        state = {"pos": None}

        def chunk_start(module, args):
            n = self.count[c]
            self.count[c] += 1
            order = self.order[c]
            self.ctx = [self.it, "forward", order[n % len(order)], None]
            state["pos"] = args[2] if len(args) > 2 else None
        chunk.register_forward_pre_hook(chunk_start)

        def watch(module, label, tensor):
            def pre(mod, args):
                self.ctx[3] = label
            module.register_forward_pre_hook(pre)
            module.register_forward_hook(lambda mod, args, out: self._activation(label, tensor, out, state["pos"]))
        if chunk.embedding is not None:
            watch(chunk.embedding, "embedding", "output")
        for key, layer in chunk.decoder.layers.items():
            label = f"decoder.layers.{key}"
            for sub in SUBLAYERS:
                watch(getattr(layer, sub), label, sub)
            watch(layer, label, "output")
        if chunk.decoder.final_layernorm is not None:
            watch(chunk.decoder.final_layernorm, "decoder.final_layernorm", "output")


class ReferenceRecording:
    """``train_reference(probe=ReferenceRecording)``: the single-device tensors, whole."""

    def __init__(self, model):
        self.model, self.it = model, 0
        self.weights, self.grads, self.acts = {}, {}, {}
        hooks = [(model.embedding, "embedding", "output"), (model.decoder.final_layernorm, "decoder.final_layernorm", "output")]
        for key, layer in model.decoder.layers.items():
            hooks += [(getattr(layer, sub), f"decoder.layers.{key}", sub) for sub in SUBLAYERS]
            hooks.append((layer, f"decoder.layers.{key}", "output"))
        for module, label, tensor in hooks:
            module.register_forward_hook(lambda m, a, out, label=label, tensor=tensor: self._act(label, tensor, out))

    def _act(self, layer, tensor, out) -> None:
        it = self.it
        self.acts.setdefault((it, "forward", layer, tensor), []).append(out.detach().clone())
        if out.requires_grad:
            out.register_hook(lambda g: self.acts.setdefault((it, "backward", layer, tensor + ".grad"), [])
                              .append(g.detach().clone()))

    def _grads(self, it: int) -> None:
        self.grads[it] = {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}

    def begin(self, iteration: int) -> None:
        if iteration > 0:
            self._grads(iteration - 1)
        self.it = iteration
        self.weights[iteration] = {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def end(self) -> dict:
        self._grads(self.it)
        acts = {k: torch.cat(v, dim=0) for k, v in self.acts.items()}   # microbatches (MoE) in order
        return {"weights": self.weights, "grads": self.grads, "acts": acts}
