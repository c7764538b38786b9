"""labkit.megatron_bridge: configurations exported as Megatron-LM flags; Megatron logs parsed into pandas.

The log samples in data/megatron_logs/ were formatted by the format code of the sources they name
(data/README.md, section "megatron_logs/"); the expected values below are read off those lines.
"""
from pathlib import Path

import pytest

from labkit.calc.megatron_args import FLAGS
from labkit.megatron_bridge import parse_line, parse_log, parse_memory, to_flags
from labkit.training import TrainConfig, format_iteration

ROOT = Path(__file__).resolve().parent.parent


def _pairs(flags):
    out, i = {}, 0
    while i < len(flags):
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            out[flags[i]] = flags[i + 1]
            i += 2
        else:
            out[flags[i]] = True
            i += 1
    return out


def test_flags_use_megatron_names_and_spell_out_differing_defaults():
    cfg = TrainConfig(tensor_model_parallel_size=2, sequence_parallel=True, global_batch_size=16,
                      pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1)
    f = _pairs(to_flags(cfg, steps=100))
    assert f["--tensor-model-parallel-size"] == "2" and f["--sequence-parallel"] is True
    assert f["--num-layers-per-virtual-pipeline-stage"] == "1" and f["--global-batch-size"] == "16"
    assert f["--train-iters"] == "100" and f["--max-position-embeddings"] == f["--seq-length"] == "64"
    # Megatron's defaults differ from labkit's here, so they must be explicit
    assert f["--hidden-dropout"] == f["--attention-dropout"] == "0.0" and f["--clip-grad"] == "0.0"
    assert "--params-dtype" not in f and "--zero-stage" not in f


def test_flags_round_trip_through_labkits_own_command_line():
    from labkit.__main__ import train_parser
    cfg = TrainConfig(tensor_model_parallel_size=2, micro_batch_size=4, global_batch_size=32, lr=3e-4,
                      use_distributed_optimizer=True, untie_embeddings_and_output_weights=True)
    args = vars(train_parser().parse_args(to_flags(cfg, steps=7)))
    assert args.pop("steps") == 7 and args.pop("max_position_embeddings") == 64
    fields = {k: v for k, v in args.items() if k in {f.name for f in __import__("dataclasses").fields(TrainConfig)}}
    assert TrainConfig(**fields) == cfg


def test_zero_stages_map_to_the_distributed_optimizer_or_megatron_fsdp():
    assert "--use-distributed-optimizer" in to_flags(TrainConfig(zero_stage=1))
    for stage, strategy in ((2, "optim_grads"), (3, "optim_grads_params")):
        f = _pairs(to_flags(TrainConfig(zero_stage=stage)))
        assert f["--use-megatron-fsdp"] is True and f["--ckpt-format"] == "fsdp_dtensor"
        assert f["--data-parallel-sharding-strategy"] == strategy
    assert "--use-megatron-fsdp" not in to_flags(TrainConfig(zero_stage=1))


def test_every_exported_flag_is_a_megatron_flag():
    cfg = TrainConfig(tensor_model_parallel_size=2, sequence_parallel=True, zero_stage=3,
                      untie_embeddings_and_output_weights=True, ddp_bucket_size=1000)
    flags = [f for f in to_flags(cfg, steps=3) if f.startswith("--")]
    assert flags and all(f[2:] in FLAGS for f in flags)


def test_parse_megatron_log_from_the_tutorial_log():
    df = parse_log((ROOT / "data" / "megatron_log_h200_dp2.txt").read_text())
    assert list(df.iteration) == [26, 27] and set(df.train_iters) == {500000}
    assert list(df.elapsed_ms) == [436.9, 437.5] and list(df.global_batch_size) == [64, 64]
    assert df.lm_loss.iloc[0] == pytest.approx(10.29183) and df.time.iloc[0] == "2025-09-08 00:19:09"


def test_parse_labkit_lines_and_reject_text_without_any():
    line = format_iteration(3, 10, 24, 12.3, 1e-3, 8, 5.5, 1.25)
    row = parse_line(line)
    assert row == {"iteration": 3, "train_iters": 10, "consumed_samples": 24, "elapsed_ms": 12.3,
                   "learning_rate": 1e-3, "global_batch_size": 8, "lm_loss": 5.5, "loss_scale": 1.0,
                   "grad_norm": 1.25, "skipped_iterations": 0, "nan_iterations": 0}
    assert parse_line("> building GPT model ...") is None
    with pytest.raises(ValueError, match="no Megatron iteration lines"):
        parse_log("nothing here\n")


LOGS = ROOT / "data" / "megatron_logs"


def test_current_megatron_lines_keep_every_field_and_the_microsecond_stamp():
    df, mem = parse_log((LOGS / "megatron_lm_d98e8a64_dense.txt").read_text(), memory=True)
    assert list(df.iteration) == [10, 20, 30] and df.time.iloc[0] == "2026-08-22 15:23:12.223456"
    assert list(df.tflops_per_gpu) == [41.3, 83.7, 83.8]
    assert list(df.num_zeros) == [1520, 980, 1043] and df.params_norm.iloc[2] == 288.447
    assert df.learning_rate.iloc[1] == pytest.approx(1.2e-05) and df.loss_scale.iloc[0] == 1.0
    assert list(mem["rank"]) == [0, 2, 4, 6] and set(mem.iteration) == {10}
    assert mem.max_allocated_mb.iloc[0] == 14852.29 and mem.reserved_mb.iloc[3] == 15975.82


def test_unknown_fields_are_kept_moe_and_mtp_losses():
    df, mem = parse_log((LOGS / "megatron_lm_d98e8a64_moe_mtp.txt").read_text(), memory=True)
    assert list(df.load_balancing_loss) == [1.012345, 1.004211]
    assert list(df.mtp_1_loss) == [8.4467, 7.9912] and list(df.skipped_iterations) == [0, 1]
    assert mem.device_memory_used_mb.iloc[0] == 64012.31
    row = parse_line(" iteration 1/ 2 | lm loss: 1.0E+00 | new field (x/y): 7 | mode: fast |")
    assert row["new_field_x_y"] == 7 and row["mode"] == "fast"


def test_megatron_2021_lines_without_time_stamp_and_unformatted_memory():
    df, mem = parse_log((LOGS / "megatron_lm_2021_81ad628e.txt").read_text(), memory=True)
    assert "time" not in df and list(df.iteration) == [100, 200, 300]
    assert list(df.loss_scale) == [262144.0, 262144.0, 131072.0] and df.skipped_iterations.iloc[2] == 1
    assert df.learning_rate.iloc[0] == pytest.approx(5e-6)
    assert list(mem["rank"]) == [0, 1] and mem.allocated_mb.iloc[0] == 4519.22314453125


def test_megatron_deepspeed_throughput_fields():
    df, mem = parse_log((LOGS / "megatron_deepspeed_00caa0e9.txt").read_text(), memory=True)
    assert list(df.consumed_tokens) == [5242880, 10485760] and list(df.actual_seqlen) == [2048, 2048]
    assert list(df.samples_per_second) == [115.8, 116.448]
    assert list(df.tokens_per_gpu_per_second) == [14822.454, 14905.386]
    assert list(df.tflops_per_gpu) == [118.42, 119.08] and "loss_scale" not in df
    assert mem.max_allocated_mb.iloc[0] == 21877.8076171875


def test_prefixed_lines_and_no_memory_reports():
    line = "[default0]: [2026-01-02 03:04:05.000001] iteration        5/      10 | lm loss: 2.5E+00 |"
    assert parse_line(line) == {"iteration": 5, "train_iters": 10, "time": "2026-01-02 03:04:05.000001",
                                "lm_loss": 2.5}
    assert parse_memory("iteration 1/ 2 | lm loss: 1.0 |\n").empty
