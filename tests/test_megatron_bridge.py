"""labkit.megatron: configurations exported as Megatron-LM flags; Megatron logs parsed into pandas."""
from pathlib import Path

import pytest

from labkit.megatron import parse_line, parse_log, to_flags
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


def test_zero_stages_map_to_the_distributed_optimizer_or_are_refused():
    assert "--use-distributed-optimizer" in to_flags(TrainConfig(zero_stage=1))
    with pytest.raises(ValueError, match="no Megatron-LM flag"):
        to_flags(TrainConfig(zero_stage=3))


def test_parse_megatron_log_from_the_seed_notes():
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
