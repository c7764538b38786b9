"""Configuration: the model (GPTConfig), the training run (TrainConfig), and every rule and refusal.

Field names are Megatron-LM's arguments (``--tensor-model-parallel-size`` -> ``tensor_model_parallel_size``).
Pure Python (no torch): checked before any process starts; the same checks run in the browser.

Two kinds of rule, one home each:

* Megatron's own start-up rules (heads divisible by TP, layers by PP, the global batch rule, ...)
  live in ``labkit.calc.config.validate``: the calculators, the static page, the Megatron estimate
  and ``labkit.train`` all call that one function. :func:`check` builds the calculator's view of a
  TrainConfig and calls it first, so the messages are the same everywhere.
* What labkit itself refuses (a layout Megatron runs but labkit does not implement, or a labkit-only
  option used wrongly) is in :func:`check`, each with its reason. Lifting a refusal is deleting
  its lines and adding a parity test against ``labkit.reference``.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace

from .calc import config as megatron_rules, hyperparams
from .calc.moe import MoEArgs
from .spec import PRESETS, ArchArgs, GPTConfig, preset, preset_args  # noqa: F401 - the model spec
from .precision_rules import check_precision
from .roles import RECOMPUTE_MODULES  # what labkit.recompute implements, read off the roles
from .topology import Topology
from .validate import positive_int

BYTE_VOCAB_SIZE = 256  # labkit.data.ByteTokenizer: UTF-8 bytes


def padded_vocab_size(vocab_size: int, make_vocab_size_divisible_by: int = 128, tp: int = 1) -> int:
    """Megatron pads the vocabulary to a multiple of ``make_vocab_size_divisible_by * tp`` so each
    tensor-parallel rank holds an equal slice of the embedding (``_vocab_size_with_padding``)."""
    multiple = make_vocab_size_divisible_by * tp
    return int(math.ceil(vocab_size / multiple) * multiple)


@dataclass(frozen=True)
class TrainConfig(ArchArgs, MoEArgs):
    """One training run of ``labkit.train`` (and ``labkit.reference``), Megatron's names; the model
    family's choices come from ``labkit.spec.ArchArgs`` (``**preset_args("llama3-tiny")`` gives a
    preset's), the MoE arguments from :class:`MoEArgs`."""

    # model (vocabulary: the byte tokenizer's 256, padded as Megatron pads)
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    seq_length: int = 64
    ffn_hidden_size: int | None = None
    make_vocab_size_divisible_by: int = 128
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    params_dtype: str = "float32"  # "float64" for exact parity tests on CPU
    # mixed precision (labkit.precision): Megatron's --bf16 / --fp16 and its loss-scale arguments
    bf16: bool = False
    fp16: bool = False
    loss_scale: float | None = None          # fp16: a constant scale; None = dynamic
    initial_loss_scale: float = 2.0 ** 32
    min_loss_scale: float = 1.0
    loss_scale_window: float = 1000          # clean iterations before the dynamic scale grows
    hysteresis: int = 2                      # overflows since the last growth (not in a row) before it halves
    accumulate_allreduce_grads_in_fp32: bool = False   # fp16: fp32 main_grad (bf16: always)
    # FP8 GEMMs in the transformer layers' linear layers (labkit.fp8.linear); Megatron's names:
    # fp8 is --fp8-format ("e4m3" | "hybrid"; None: off)
    fp8: str | None = None
    fp8_recipe: str = "delayed"              # tensorwise | delayed | blockwise | mxfp8
    fp8_amax_history_len: int = 1
    fp8_amax_compute_algo: str = "most_recent"   # or "max"
    fp8_margin: int = 0
    tp_only_amax_red: bool = False           # amaxes over tp (x cp) only, not dp (Megatron-Core's config field)
    fp8_param_gather: bool = False           # ZeRO-3: all-gather the FP8 linears' weights in FP8 (1 B/element)
    # activation recomputation (labkit.recompute)
    recompute_granularity: str | None = None   # "full" or "selective"
    recompute_method: str | None = None        # full: "uniform" or "block"
    recompute_num_layers: int | None = None    # full: layers per recompute unit / recomputed per chunk
    recompute_modules: tuple | None = None     # selective: default ("core_attn",)
    # batch
    micro_batch_size: int = 2
    global_batch_size: int | None = None   # None: micro_batch_size * dp (no accumulation)
    # optimizer (AdamW, constant learning rate)
    lr: float = 1e-3
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 0.0  # Megatron's default is 1.0; 0 turns clipping off
    # parallelism
    tensor_model_parallel_size: int = 1
    sequence_parallel: bool = False
    pipeline_model_parallel_size: int = 1
    num_layers_per_virtual_pipeline_stage: int | None = None
    pipeline_schedule: str | None = None   # labkit's: None = Megatron's (1f1b, interleaved_1f1b if v > 1)
    context_parallel_size: int = 1
    cp_comm_type: str = "p2p"       # Megatron's --cp-comm-type: "p2p" (ring), "all_gather", "a2a"
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None  # None: tensor_model_parallel_size (Megatron)
    moe_token_dispatcher_type: str = "allgather"    # or "alltoall" (Megatron's default: allgather)
    use_distributed_optimizer: bool = False
    zero_stage: int = 0
    ddp_bucket_size: int | None = None  # None: all-reduce after backward; else bucket size (elements)
    # data: None = the shipped corpus (labkit.data); else Megatron's --data-path, the PREFIX of an
    # indexed dataset PREFIX.bin/.idx, sampled as Megatron's GPTDataset (labkit.indexed_dataset)
    data_path: str | None = None

    # -- derived ------------------------------------------------------------------------------
    def __post_init__(self):
        if self.num_experts is not None and self.moe_ffn_hidden_size is None:   # Megatron: moe ffn = ffn
            object.__setattr__(self, "moe_ffn_hidden_size",
                               self.ffn_hidden_size or self.default_ffn_hidden_size())
        self._check_moe()
        self._check_arch()

    def topology(self, world_size: int) -> Topology:
        return Topology(world_size, tp=self.tensor_model_parallel_size,
                        pp=self.pipeline_model_parallel_size, cp=self.context_parallel_size,
                        ep=self.expert_model_parallel_size, etp=self.expert_tensor_parallel_size)

    def validate(self, world_size: int) -> Topology:
        return check(self, world_size)      # every rule for this world size; returns the Topology

    def global_batch(self, topo: Topology) -> int:
        return self.global_batch_size or self.micro_batch_size * topo.dp

    def num_microbatches(self, topo: Topology) -> int:
        return self.global_batch(topo) // (self.micro_batch_size * topo.dp)

    @property
    def effective_zero_stage(self) -> int:
        """The ZeRO stage in use: Megatron's distributed optimizer is stage 1."""
        return self.zero_stage or (1 if self.use_distributed_optimizer else 0)

    def virtual_pipeline_size(self) -> int:
        """v: model chunks per pipeline rank (1 without interleaving)."""
        if self.num_layers_per_virtual_pipeline_stage is None:
            return 1
        per_rank = self.num_layers // self.pipeline_model_parallel_size
        return per_rank // self.num_layers_per_virtual_pipeline_stage

    def stage_layers(self, stage: int) -> range:
        """Layers of virtual pipeline stage ``stage`` (of pp * v): an even, contiguous split."""
        from .pipeline_parallel.placement import stage_layers
        return stage_layers(self.num_layers, self.pipeline_model_parallel_size * self.virtual_pipeline_size(),
                            stage)

    def schedule_name(self) -> str:
        """The pipeline schedule this run uses (``pipeline_parallel.placement.SCHEDULES``)."""
        from .pipeline_parallel.placement import default_schedule
        return self.pipeline_schedule or default_schedule(self.virtual_pipeline_size())

    def embedding_ranks(self) -> list[int]:
        """Pipeline ranks of the embedding group: those holding the first and the last stage under
        this run's placement (``placement.embedding_ranks``; one rank under a V)."""
        from .pipeline_parallel.placement import embedding_ranks, placement_of
        return embedding_ranks(self.pipeline_model_parallel_size, self.virtual_pipeline_size(),
                               placement_of(self.schedule_name()))

    def model_config(self, tp: int | None = None) -> GPTConfig:
        tp = self.tensor_model_parallel_size if tp is None else tp
        return GPTConfig(num_layers=self.num_layers, hidden_size=self.hidden_size,
                         num_attention_heads=self.num_attention_heads, seq_length=self.seq_length,
                         ffn_hidden_size=self.ffn_hidden_size,
                         vocab_size=padded_vocab_size(BYTE_VOCAB_SIZE, self.make_vocab_size_divisible_by, tp),
                         hidden_dropout=self.hidden_dropout, attention_dropout=self.attention_dropout,
                         **self.arch_args(), **self.moe_args())

    def megatron_view(self, world_size: int):
        """(ModelConfig, ParallelConfig) of ``labkit.calc`` for this run: what the rule book and
        the calculators see (the byte tokenizer's vocabulary, fp32 in the labs)."""
        # the ParallelConfig first: Megatron checks the world size before the model's sizes
        par = megatron_rules.ParallelConfig(
            world_size=world_size, tensor_model_parallel_size=self.tensor_model_parallel_size,
            pipeline_model_parallel_size=self.pipeline_model_parallel_size,
            num_layers_per_virtual_pipeline_stage=self.num_layers_per_virtual_pipeline_stage,
            context_parallel_size=self.context_parallel_size, sequence_parallel=self.sequence_parallel,
            expert_model_parallel_size=self.expert_model_parallel_size,
            expert_tensor_parallel_size=self.expert_tensor_parallel_size,
            micro_batch_size=self.micro_batch_size, global_batch_size=self.global_batch_size,
            use_distributed_optimizer=self.use_distributed_optimizer, zero_stage=self.zero_stage,
            recompute_granularity=self.recompute_granularity, recompute_method=self.recompute_method,
            recompute_num_layers=self.recompute_num_layers, recompute_modules=self.recompute_modules,
            pipeline_schedule=self.pipeline_schedule)
        model = megatron_rules.ModelConfig(
            num_layers=self.num_layers, hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads, seq_length=self.seq_length,
            vocab_size=BYTE_VOCAB_SIZE, ffn_hidden_size=self.ffn_hidden_size,
            make_vocab_size_divisible_by=self.make_vocab_size_divisible_by,
            **self.calc_arch(), **self.moe_sizes())
        return model, par


def check(cfg: TrainConfig, world_size: int) -> Topology:
    """Megatron's rules (``labkit.calc.config.validate``), then labkit's refusals; returns the
    Topology. Raises ValueError naming the rule and the numbers."""
    positive_int("world_size", world_size)
    hyperparams.check_hyperparameters(cfg)       # types of every field, lr, betas, clip (labkit's)
    model, par = cfg.megatron_view(world_size)   # sizes positive, world divisible by tp*pp*cp
    megatron_rules.validate(model, par)          # Megatron's start-up rules, in one place
    par.check_recompute_args()                   # and its recompute arguments' (the same book)
    cfg.model_config()                           # dropout in [0, 1)
    topo = cfg.topology(world_size)
    tp, pp, cp = topo.tp, topo.pp, topo.cp
    # -- labkit's refusals and labkit-only options ----------------------------------------------
    if cfg.data_path is not None:
        missing = [p for p in (f"{cfg.data_path}.bin", f"{cfg.data_path}.idx") if not os.path.isfile(p)]
        if missing:
            raise ValueError(f"data_path {cfg.data_path!r}: {' and '.join(missing)} not found (the path "
                             f"is a PREFIX: Megatron's indexed dataset is PREFIX.bin + PREFIX.idx)")
    if cfg.params_dtype not in ("float32", "float64"):
        raise ValueError(f"params_dtype must be 'float32' or 'float64', got {cfg.params_dtype!r}")
    check_precision(cfg)
    _check_recompute(cfg)
    if cfg.zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {cfg.zero_stage!r}")
    positive_int("ddp_bucket_size", cfg.ddp_bucket_size, allow_none=True)
    zero = cfg.effective_zero_stage
    if zero and cfg.ddp_bucket_size is not None:
        raise ValueError(f"ddp_bucket_size {cfg.ddp_bucket_size} applies to zero_stage 0 only: labkit's "
                         f"ZeRO stages communicate whole flat buffers")
    if zero >= 2 and pp > 1:
        # DeepSpeed asserts the same ("ZeRO-2 and ZeRO-3 are incompatible with pipeline
        # parallelism"), and Megatron refuses --use-torch-fsdp2 with PP: every microbatch would
        # reduce-scatter the gradients (and ZeRO-3 gather the weights twice), m times per step.
        raise ValueError(f"zero_stage {zero} with pipeline_model_parallel_size {pp}: gradients (and "
                         f"under ZeRO-3 weights) would move once per microbatch, m times per step; "
                         f"use zero_stage 1 (the distributed optimizer) with pipelines, as Megatron does")
    if cfg.pipeline_schedule is not None:
        from .pipeline_parallel.placement import check_schedule
        check_schedule(cfg.pipeline_schedule, cfg.virtual_pipeline_size())
    if cfg.pipeline_schedule == "zb_h1" and max(tp, cp, topo.ep) > 1:     # found by labkit fuzz, seed 4
        raise ValueError(f"pipeline_schedule 'zb_h1' with tensor_model_parallel_size {tp}, context_parallel_size "
                         f"{cp}, expert_model_parallel_size {topo.ep}: labkit's W step walks the backward graph "
                         f"again (autograd with inputs=the weights, after B kept the graph), so the backward's "
                         f"TP, CP and EP collectives would run twice; Megatron's zero-bubble schedules split "
                         f"each linear's backward into dgrad (B) and wgrad (W) instead. Use zb_h1 with pipeline "
                         f"and data parallelism only")
    _check_context_parallel(cfg, tp, cp)
    _check_moe_layout(cfg, topo)
    return topo


def _check_recompute(cfg: TrainConfig) -> None:
    """labkit's part (Megatron's own checks ran in the rule book): the modules labkit recomputes,
    and uniform units that tile a model chunk."""
    extra = set(cfg.recompute_modules or ()) - set(RECOMPUTE_MODULES)
    if cfg.recompute_granularity == "selective" and extra:
        raise ValueError(f"recompute_modules {sorted(extra)}: labkit recomputes {list(RECOMPUTE_MODULES)}")
    per_chunk = cfg.num_layers // (cfg.pipeline_model_parallel_size * cfg.virtual_pipeline_size())
    k, uniform = cfg.recompute_num_layers, cfg.recompute_method == "uniform"
    if cfg.recompute_granularity == "full" and k is not None and (k > per_chunk or (uniform and per_chunk % k)):
        raise ValueError(f"recompute_num_layers {k} with {per_chunk} layers per model chunk: must be at most "
                         f"{per_chunk}" + (", and divide it for the uniform method" if uniform else ""))


def _check_context_parallel(cfg: TrainConfig, tp: int, cp: int) -> None:
    """CP: Megatron's --cp-comm-type values (seq_length % 2cp is Megatron's rule), a2a's heads."""
    if cfg.cp_comm_type not in ("p2p", "all_gather", "allgather", "a2a"):   # allgather: the help's spelling
        raise ValueError(f"cp_comm_type must be 'p2p', 'all_gather' or 'a2a' (labkit has no hierarchical "
                         f"'a2a+p2p'), got {cfg.cp_comm_type!r}")
    if cp > 1 and cfg.cp_comm_type == "a2a" and (cfg.num_attention_heads // tp) % cp:
        raise ValueError(f"cp_comm_type 'a2a' needs heads per TP rank divisible by CP: num_attention_heads "
                         f"{cfg.num_attention_heads} / TP {tp} = {cfg.num_attention_heads // tp}, not divisible by CP {cp}")
    groups = max(1, cfg.query_groups // tp)          # K/V heads per TP rank (one shared group at least)
    if cp > 1 and cfg.cp_comm_type == "a2a" and groups % cp:
        raise ValueError(f"cp_comm_type 'a2a' needs the K/V groups per TP rank divisible by CP: "
                         f"num_query_groups {cfg.query_groups} over TP {tp} leaves {groups}, not divisible by CP {cp}")
    if cp > 1 and cfg.attention_dropout > 0:
        raise ValueError(f"attention_dropout {cfg.attention_dropout} with context_parallel_size {cp}: labkit's "
                         f"blockwise attention has no attention-probability dropout; set it to 0")


def _check_moe_layout(cfg: TrainConfig, topo: Topology) -> None:
    """MoE: Megatron's training-time rule (MoE + TP needs SP), and what labkit implements."""
    if cfg.num_experts is None:
        return
    if cfg.moe_token_dispatcher_type not in ("allgather", "alltoall"):
        raise ValueError(f"moe_token_dispatcher_type must be 'allgather' or 'alltoall' in labkit, got "
                         f"{cfg.moe_token_dispatcher_type!r} (Megatron also has 'flex')")
    if topo.tp > 1 and not cfg.sequence_parallel:  # Megatron: moe_layer.py MoELayer.forward
        raise ValueError(f"num_experts {cfg.num_experts} with tensor_model_parallel_size {topo.tp} needs "
                         f"sequence_parallel: Megatron refuses MoE with TP but without SP in training")
    if topo.etp not in (1, topo.tp):
        raise ValueError(f"expert_tensor_parallel_size {topo.etp}: labkit implements 1 or the TP size "
                         f"{topo.tp} (Megatron's default)")
    # the shared expert's width over TP is Megatron's rule 9 (calc/rules.py), checked above
    if topo.cp > 1:
        raise ValueError(f"num_experts with context_parallel_size {topo.cp}: not in labkit yet")


def train_config(**config) -> TrainConfig:
    """A TrainConfig from keyword arguments; an unknown name is a ValueError naming it."""
    unknown = set(config) - {f.name for f in fields(TrainConfig)}
    if unknown:
        raise ValueError(f"unknown configuration {sorted(unknown)}; see labkit.config.TrainConfig")
    return TrainConfig(**config)
