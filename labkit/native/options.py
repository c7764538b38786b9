"""What the PyTorch-native path runs, and what it refuses (with the reason), for a TrainConfig.

Pure Python: checked before any process starts, as ``labkit.config.check`` is for labkit's own
implementation. A TrainConfig (Megatron's names) maps onto PyTorch's APIs like this:

    TrainConfig                                   PyTorch-native                    torchtitan
    data parallel, zero_stage 0                   FSDP2 machinery, replicate only   data_parallel_replicate_degree
    zero_stage 3                                  fully_shard per layer             data_parallel_shard_degree
    zero_stage 2                                  ... reshard_after_forward=False   fsdp_reshard_after_forward="never"
    tensor_model_parallel_size, sequence_parallel parallelize_module plan           tensor_parallel_degree
    pipeline_model_parallel_size (+ schedule)     torch.distributed.pipelining      pipeline_parallel_degree
                                                                                    pipeline_parallel_schedule
:class:`NativeOptions` carries what Megatron's flags cannot say (the schedule name, HSDP's
replica count, FSDP2's mixed precision, loss parallel).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..validate import positive_int

SCHEDULES = ("1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")     # two stages per rank, placed r and 2p-1-r

# context_parallel on the CPU, reproduced with the pinned torch (2.13.0, gloo): the error PyTorch
# raises, quoted in refusals and in the chapter (tests/test_native_errors.py reproduces it).
CP_ERROR = ("NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default "
            "does not have a sharding strategy registered.")

# CommDebugMode around a torch.distributed.pipelining step (any schedule), same torch: its module
# tracker's multi-grad hooks meet the stage's torch.autograd.grad (the backward, and the shape
# inference of the first step), which autograd refuses; run.py counts pipeline steps without it.
COMMDEBUG_PP_ERROR = ("RuntimeError: A leaf node was passed to _will_engine_execute_node but we are "
                      "currently running autograd.grad(). This is currently not supported.")


@dataclass(frozen=True)
class NativeOptions:
    """PyTorch-native knobs beyond the TrainConfig (``labkit.train(..., implementation=...)``)."""

    schedule: str | None = None          # pipelining schedule; None: 1F1B, or Interleaved1F1B if v > 1
    dp_replicate: int = 1                # HSDP: replicas of the sharded model (dp = replicas x shards)
    mixed_precision: str | None = None   # "bf16": FSDP2 MixedPrecisionPolicy(bf16 params, fp32 reduce)
    loss_parallel: bool = True           # TP: cross-entropy on vocabulary-sharded logits

    def reshard_after_forward(self, cfg) -> bool:
        """FSDP2's knob from the ZeRO stage: 3 re-gathers weights in backward, 2 keeps them."""
        return cfg.effective_zero_stage == 3


def resolve(implementation) -> NativeOptions | None:
    """None for labkit's own implementation; NativeOptions for "native" or a NativeOptions."""
    if implementation == "labkit":
        return None
    if implementation == "native":
        return NativeOptions()
    if isinstance(implementation, NativeOptions):
        return implementation
    raise ValueError(f"implementation must be 'labkit', 'native' or a labkit.native.NativeOptions, "
                     f"got {implementation!r}")


def schedule_of(cfg, opts: NativeOptions) -> str | None:
    """The pipelining schedule this run uses (None without a pipeline)."""
    if cfg.pipeline_model_parallel_size == 1:
        return None
    if opts.schedule is not None:
        return opts.schedule
    return "1F1B" if cfg.virtual_pipeline_size() == 1 else "Interleaved1F1B"


def check_native(cfg, world_size: int, opts: NativeOptions):
    """Refuse, with the reason, a layout the native path cannot express; returns the Topology."""
    topo = cfg.validate(world_size)          # Megatron's rules and labkit's, first
    zero = cfg.effective_zero_stage
    refuse = []
    if topo.cp > 1:
        refuse.append(f"context_parallel_size {topo.cp}: torch's context_parallel shards "
                      f"scaled_dot_product_attention, which on the CPU raises {CP_ERROR} (and the "
                      f"course model's attention is its own, not SDPA)")
    if cfg.num_experts is not None:
        refuse.append("num_experts: PyTorch has no expert-parallel style (torchtitan keeps its own "
                      "MoE modules)")
    if zero == 1:
        refuse.append("zero_stage 1 / use_distributed_optimizer: FSDP2 always keeps parameters "
                      "sharded between steps; zero_stage 2 (reshard_after_forward=False) moves the "
                      "same bytes")
    if cfg.ddp_bucket_size is not None:
        refuse.append(f"ddp_bucket_size {cfg.ddp_bucket_size}: FSDP2 reduces one group per "
                      f"fully_shard module, it has no bucket size")
    if topo.tp > 1 and cfg.query_groups % topo.tp:
        refuse.append(f"num_query_groups {cfg.query_groups} with tensor_model_parallel_size {topo.tp}: "
                      f"labkit gives the tp ranks of a query group each a copy of its K and V and "
                      f"sums their gradients over those ranks (shard_plan.qkv, axis 'tp_kv'), which no "
                      f"DTensor placement expresses (a Shard holds each row on one rank); Megatron "
                      f"instead cuts the fused QKV weight contiguously (Shard(0)) and all-gathers the "
                      f"QKV output every layer, a layout DTensor could express but the native plan "
                      f"does not implement: it keeps whole query groups per rank, so num_query_groups "
                      f"must be a multiple of tensor_model_parallel_size")
    if cfg.hidden_dropout or cfg.attention_dropout:
        refuse.append("dropout: the masks come from labkit's RNG streams (Megatron's), which DTensor "
                      "and FSDP2 do not follow; set hidden_dropout and attention_dropout to 0")
    if topo.pp > 1 and not cfg.untie_embeddings_and_output_weights:
        refuse.append("tied embeddings with a pipeline: torch.distributed.pipelining has no "
                      "shared-parameter sum between the first and last stage (Megatron's embedding "
                      "group); set untie_embeddings_and_output_weights=True, as torchtitan's Llama is")
    if cfg.pipeline_schedule is not None:
        refuse.append(f"pipeline_schedule {cfg.pipeline_schedule!r} is labkit's executor's: the native "
                      f"path runs torch.distributed.pipelining's schedules, chosen by "
                      f"NativeOptions(schedule=...) (one of {', '.join(SCHEDULES)})")
    refuse += _check_options(cfg, topo, opts, zero)
    if refuse:
        raise ValueError("implementation 'native' cannot run this layout: " + "; ".join(refuse))
    return topo


def _check_options(cfg, topo, opts: NativeOptions, zero: int) -> list[str]:
    out = []
    if opts.schedule is not None and opts.schedule not in SCHEDULES:
        out.append(f"schedule must be one of {SCHEDULES}, got {opts.schedule!r}")
    sched = schedule_of(cfg, opts)
    if sched in V_SHAPED and cfg.num_layers % (2 * topo.pp):
        out.append(f"schedule {sched} holds 2 stages per rank: num_layers {cfg.num_layers} is not "
                   f"divisible by 2 x pp = {2 * topo.pp}")
    if sched in ("Interleaved1F1B", "InterleavedZeroBubble") and cfg.virtual_pipeline_size() < 2:
        out.append(f"schedule {sched} needs num_layers_per_virtual_pipeline_stage (v >= 2 stages "
                   f"per rank)")
    if sched == "1F1B" and cfg.virtual_pipeline_size() > 1:
        out.append("schedule 1F1B holds one stage per rank: drop num_layers_per_virtual_pipeline_stage")
    m = cfg.num_microbatches(topo)
    if sched == "DualPipeV" and m < 2 * topo.pp:
        out.append(f"DualPipeV needs at least as many microbatches as stages: {m} < {2 * topo.pp}")
    if sched == "1F1B" and m < topo.pp:     # torch's Schedule1F1B.__init__ (found by labkit fuzz, seed 2027)
        out.append(f"schedule 1F1B (torch's Schedule1F1B) needs at least as many microbatches as stages: "
                   f"{m} microbatches < pp {topo.pp} (labkit's own 1F1B runs it)")
    try:                                        # the one positive-int rule (labkit.validate)
        replicas = positive_int("dp_replicate", opts.dp_replicate)
    except ValueError:
        replicas = 0
    if not replicas or topo.dp % replicas:
        out.append(f"dp_replicate must divide the data-parallel size {topo.dp}, got {opts.dp_replicate!r}")
    elif opts.dp_replicate > 1 and zero < 2:
        out.append(f"dp_replicate {opts.dp_replicate} (HSDP) shards within each replica: use "
                   f"zero_stage 2 or 3")
    if opts.mixed_precision not in (None, "bf16"):
        out.append(f"mixed_precision must be None or 'bf16', got {opts.mixed_precision!r}")
    elif opts.mixed_precision and zero < 2:
        out.append("mixed_precision 'bf16' is FSDP2's MixedPrecisionPolicy: use zero_stage 2 or 3")
    elif opts.mixed_precision and cfg.params_dtype != "float32":
        out.append(f"mixed_precision 'bf16' keeps float32 master parameters: params_dtype must be "
                   f"'float32', got {cfg.params_dtype!r}")
    return out
