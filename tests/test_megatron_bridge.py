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


# ---- issue 24: the bridge's last gaps ---------------------------------------------------------
def test_moe_layer_freq_is_written_as_megatron_parses_it():
    """No spaces: Megatron's moe_freq_type (_eval_pattern) refuses them ("invalid moe_freq_type")."""
    import re

    from labkit.__main__ import train_parser
    from labkit.calc.cli import parse_flags
    from labkit.calc.moe import parse_layer_freq
    cfg = TrainConfig(num_layers=4, num_experts=4, moe_layer_freq=(1, 0, 1, 0))
    flags = to_flags(cfg, steps=2)
    text = _pairs(flags)["--moe-layer-freq"]
    assert text == "[1,0,1,0]" and not re.search(r"[^,\d\[\]\(\)\+\*]", text)   # Megatron's own check
    assert parse_flags(flags)[0]["moe_layer_freq"] == [1, 0, 1, 0]             # labkit estimate reads it
    args = vars(train_parser().parse_args(flags))                              # and labkit train
    assert parse_layer_freq(args["moe_layer_freq"], 4) == [1, 0, 1, 0]


def test_data_path_writes_split_and_the_samplers_seed(tmp_path):
    from labkit.indexed_dataset import make_tinyshakespeare_dataset
    prefix = make_tinyshakespeare_dataset(str(tmp_path / "ts"))
    cfg = TrainConfig(data_path=prefix)
    f = _pairs(to_flags(cfg, steps=3, seed=1234))
    assert f["--data-path"] == prefix and f["--split"] == "100,0,0" and f["--seed"] == "1234"
    assert f["--lr-decay-style"] == "constant"                 # labkit's learning rate is constant
    for seed in (None, 0, -1, 1.5, True):                      # Megatron refuses --seed < 1
        with pytest.raises(ValueError, match=r"^seed must be the integer >= 1"):
            to_flags(cfg, steps=3, seed=seed)
    assert "--split" not in to_flags(TrainConfig(), seed=7) and _pairs(to_flags(TrainConfig(), seed=7))["--seed"] == "7"


def test_experiment_command_carries_split_and_seed_once():
    from labkit.experiments import get, runner
    text = runner.megatron_command(get("302"), seed=99)
    assert text.count("--split 100,0,0") == 1 and text.count("--seed 99") == 1
    assert text.count("--lr-decay-style constant") == 1


def test_to_flags_says_what_it_cannot_express():
    doc = to_flags.__doc__
    for topic in ("float64", "initial weights", "weight decay", "without ``data_path``", "tokenizer",
                  "ddp_bucket_size"):
        assert topic in doc, topic


def _megatron_lines():
    """Lines formatted with Megatron-LM's own format code (d98e8a64): training.py:5373-5376
    (evaluate_and_print_results), core/timers.py:338-372, theoretical_memory_usage.py:481-484."""
    lines = [" [2026-08-22 15:23:12.223456] iteration       10/     100 | consumed samples:          640 |"
             " lm loss: 9.123456E+00 |"]
    lines += ["(min, max) time across ranks (ms):"]
    for name, lo, hi in (("forward-backward", 1001.25, 1010.5), ("optimizer", 12.0, 13.25)):
        lines += ["\n    {}: ({:.2f}, {:.2f})".format((name + " ").ljust(48, "."), lo, hi)[1:]]
    string = " validation loss at iteration 10 on validation set | "
    for key, value in (("lm loss", 8.5), ("mtp_1 loss", 8.75)):
        string += "{} value: {:.6E} | ".format(key, value)
        string += "{} PPL: {:.6E} | ".format(key, 2.718281828 ** value)
    lines += [string, "Theoretical memory footprints: weight and optimizer={:.2f} MB, activation={:.2f} MB, "
              "total={:.2f} MB".format(1234.5, 678.25, 1912.75)]
    lines += [" [2026-08-22 15:24:02.323456] iteration       20/     100 | consumed samples:         1280 |"
              " lm loss: 7.654321E+00 |", "max time across ranks (ms):",
              "    {}: {:.2f}".format(("forward-backward" + " ").ljust(48, "."), 498.0),
              "times across ranks (ms):", "  optimizer:", "     rank {:2d}: {:.2f}".format(0, 11.5),
              "     rank {:2d}: {:.2f}".format(1, 12.5), " validation-0 loss at iteration 20 on test set | "
              "lm loss value: 7.000000E+00 | lm loss PPL: 1.096633E+03 | "]
    return "\n".join(lines) + "\n"


def test_full_parse_keeps_validation_timers_and_the_theoretical_footprint():
    log = parse_log(_megatron_lines(), full=True)
    assert list(log.iterations.iteration) == [10, 20]
    v = log.validation
    assert list(v.iteration) == [10, 20] and list(v.split) == ["validation", "test"] and list(v.name) == ["", "0"]
    assert list(v.lm_loss) == [8.5, 7.0] and v.mtp_1_loss.iloc[0] == 8.75
    assert v.lm_loss_ppl.iloc[1] == pytest.approx(1096.633)
    t = log.timers
    minmax = t[t.iteration == 10]
    assert list(minmax.timer) == ["forward-backward", "optimizer"] and list(minmax.max_ms) == [1010.5, 13.25]
    assert list(minmax.min_ms) == [1001.25, 12.0]
    later = t[t.iteration == 20]
    assert later.iloc[0]["timer"] == "forward-backward" and later.iloc[0]["max_ms"] == 498.0
    assert list(later.dropna(subset=["rank"])["ms"]) == [11.5, 12.5]
    assert log.theoretical_memory == {"weight_and_optimizer_mb": 1234.5, "activation_mb": 678.25, "total_mb": 1912.75}
    assert parse_log(_megatron_lines()).equals(log.iterations)                # the plain call is unchanged


def test_theoretical_footprint_is_what_labkit_estimate_prints():
    from labkit.calc.megatron import megatron_estimate
    from labkit.megatron_bridge import parse_theoretical_memory
    est = megatron_estimate(8, num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                            vocab_size=128, micro_batch_size=2)
    got = parse_theoretical_memory(est["report"])
    assert got["total_mb"] == round(est["total_bytes"] / 2**20, 2)


@pytest.mark.parametrize("bad, field", [
    (" iteration        3/      10 | consumed samples: 10/20 | lm loss: 1.0E+00 |", "consumed samples"),
    (" iteration        3/      10 | lm loss: nan/inf? |", "lm loss"),
    (" validation loss at iteration 3 | lm loss value: 1/2 |", "lm loss value"),
    ("Theoretical memory footprints: unknown", None),
])
def test_a_line_that_does_not_read_is_named(bad, field):
    text = _megatron_lines().splitlines()
    text.insert(2, bad)
    with pytest.raises(ValueError, match=r"^line 3: ") as err:
        parse_log("\n".join(text), full=True)
    assert bad.strip()[:40] in str(err.value) and (field is None or repr(field) in str(err.value))
