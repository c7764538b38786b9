"""``to_flags``: a labkit configuration as Megatron-LM's ``pretrain_gpt.py`` flags (chapter "From
labkit to Megatron-LM"). labkit's configuration fields are Megatron's argument names, so the export is
mechanical; every flag written is checked against Megatron's own list (``labkit.calc.megatron_flags``,
commit d98e8a64), and what the flags cannot say is listed in :func:`to_flags`.
"""
from __future__ import annotations

import dataclasses

from ..training import TrainConfig
from ..validate import int_at_least

# fields that are labkit's own (no Megatron flag of that name) or need translating
_NOT_MEGATRON = {"params_dtype", "zero_stage", "pipeline_schedule",
                 "tp_only_amax_red"}   # a TransformerConfig field of Megatron-Core, no flag at d98e8a64

# ZeRO stage -> Megatron flags. Stage 1: the distributed optimizer (optimizer state sharded over
# DP; it also reduce-scatters the gradients). Stages 2 and 3: Megatron-FSDP with its sharding
# strategies "optim_grads" and "optim_grads_params" (arguments.py @ d98e8a64, choices no_shard,
# optim, optim_grads, optim_grads_params); Megatron-FSDP asserts --ckpt-format fsdp_dtensor.
ZERO_FLAGS = {
    1: ["--use-distributed-optimizer"],
    2: ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads",
        "--ckpt-format", "fsdp_dtensor"],
    3: ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
        "--ckpt-format", "fsdp_dtensor"],
}

def to_flags(config: TrainConfig | dict, steps: int | None = None, seed: int | None = None) -> list[str]:
    """``pretrain_gpt.py`` flags for a labkit configuration (model, batch, optimizer, parallelism,
    the data file). Fields at a default Megatron shares are left out.

    ``zero_stage`` has no Megatron flag of that name. Stage 1 is ``--use-distributed-optimizer``;
    stage 2 is Megatron-FSDP sharding optimizer state and gradients (``--use-megatron-fsdp
    --data-parallel-sharding-strategy optim_grads``), stage 3 also the parameters (``...
    optim_grads_params``); Megatron-FSDP also needs ``--ckpt-format fsdp_dtensor`` and
    CUDA_DEVICE_MAX_CONNECTIONS unset or > 1 (validate_args, arguments.py @ d98e8a64).
    labkit's learning rate is constant: ``--lr-decay-style constant`` (Megatron decays linearly).
    With ``data_path``: ``--split 100,0,0`` (the whole file is the training split) and ``--seed``
    = ``seed``, the seed ``labkit.train`` samples with (required then; Megatron refuses seeds < 1),
    so Megatron's GPTDataset draws the same samples in the same order (``labkit.indexed_dataset``).

    What the flags cannot say (the runs differ there; the chapter lists it too):

    * ``params_dtype`` "float64": Megatron has no fp64 training; the flags describe fp32 (its
      default, no flag). Megatron's --fp16/--bf16 mixed precision has no labkit runtime yet.
    * the initial weights: Megatron draws them from its own RNG (seed + 100 x pp rank, scaled init
      of the output layers); losses agree in distribution, not digit by digit.
    * weight decay: labkit's AdamW decays every parameter; Megatron none of the biases and 1-D
      parameters (wd_mult 0, megatron/core/optimizer/__init__.py @ d98e8a64).
    * the data without ``data_path``: labkit's shipped corpus sampler (``labkit.data``) has no
      Megatron counterpart; make an indexed dataset (``indexed_dataset.make_tinyshakespeare_dataset``).
    * the tokenizer: labkit's model reads bytes (vocabulary 256); Megatron needs a tokenizer flag
      (``--tokenizer-type NullTokenizer --vocab-size 256`` for a byte-level file, as
      ``labkit.experiments.runner.megatron_command`` writes).
    * ``ddp_bucket_size`` None (one all-reduce after the backward) and labkit's unbucketed ZeRO
      stages: Megatron always buckets; the sums are the same, the messages are not.
    * ``train(log_interval=...)``, ``timeout``: logging and labkit's launcher, not the run.
    """
    from ..calc.megatron_args import FLAGS
    cfg = TrainConfig(**config) if isinstance(config, dict) else config
    flags = []
    for f in dataclasses.fields(TrainConfig):
        value = getattr(cfg, f.name)
        if f.name in _NOT_MEGATRON or value == f.default or value is None:
            continue
        if isinstance(value, bool):      # the switch storing this value (False: --disable-bias-linear)
            flags.append(_switch(f.name, value))
            continue
        flag = "--" + {"fp8": "fp8-format"}.get(f.name, f.name.replace("_", "-"))
        # moe_layer_freq: "[0,1,0,1]", no spaces (Megatron's moe_freq_type refuses them)
        text = "[" + ",".join(str(int(v)) for v in value) + "]" if isinstance(value, tuple) else str(value)
        flags += [flag, text]
    if cfg.pipeline_schedule not in (None, cfg.schedule_name()) or cfg.schedule_name() not in (
            "1f1b", "interleaved_1f1b"):
        raise ValueError(f"pipeline_schedule {cfg.pipeline_schedule!r}: Megatron-LM runs 1F1B, or its "
                         f"interleaved 1F1B when v > 1; it has no flag for another schedule")
    if cfg.zero_stage and not (cfg.zero_stage == 1 and "--use-distributed-optimizer" in flags):
        flags += ZERO_FLAGS[cfg.zero_stage]
    # flags Megatron needs, or whose Megatron default differs from labkit's (dropout 0.1 there,
    # clip_grad 1.0 there, lr has no default): always written out
    for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
                 "lr", "clip_grad", "hidden_dropout", "attention_dropout"):
        flag = "--" + name.replace("_", "-")
        if flag not in flags:
            flags += [flag, str(getattr(cfg, name))]
    flags += ["--max-position-embeddings", str(cfg.seq_length), "--lr-decay-style", "constant"]
    if steps is not None:
        flags += ["--train-iters", str(steps)]
    if cfg.data_path is not None or seed is not None:
        int_at_least("seed", seed, 1, what="the integer >= 1 labkit.train samples the data with (Megatron "
                                         "refuses --seed < 1; with data_path it fixes the samples' order)")
        flags += (["--split", "100,0,0"] if cfg.data_path is not None else []) + ["--seed", str(seed)]
    unknown = [f for f in flags if f.startswith("--") and f[2:] not in FLAGS]
    if unknown:
        raise ValueError(f"not Megatron-LM flags (arguments.py @ d98e8a64): {unknown}")
    return flags


def _switch(dest: str, value: bool) -> str:
    """The Megatron switch that stores ``value`` into ``args.dest`` (``--swiglu``; for
    ``add_bias_linear=False``, ``--disable-bias-linear``), from Megatron's own flag table."""
    from ..calc.megatron_args import FLAGS
    same = dest.replace("_", "-")
    options = [f for f, (d, kind, stored) in FLAGS.items() if d == dest and kind == "switch" and stored == value]
    if not options:
        raise ValueError(f"{dest}={value}: Megatron-LM has no switch that sets it (arguments.py @ d98e8a64)")
    return "--" + (same if same in options else sorted(options)[0])
