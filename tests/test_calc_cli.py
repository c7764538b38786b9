"""``python -m labkit estimate``: Megatron-LM's flags, checked against Megatron's own argument list.

The flag list is labkit.calc.megatron_flags (generated from megatron/training/arguments.py @
d98e8a64). The pasted command line is examples/gpt3/train_gpt3_175b_distributed.sh of that commit.
"""
import json
import shlex
import subprocess
import sys

import pytest

from labkit.calc import megatron_estimate
from labkit.calc.cli import main, parse_flags
from labkit.calc.megatron_args import FLAGS
from labkit.calc.megatron_flags import ESTIMATE_DEFAULTS

SMALL = ["--world-size", "8", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
         "--seq-length", "32", "--micro-batch-size", "1", "--vocab-size", "256"]

# examples/gpt3/train_gpt3_175b_distributed.sh @ d98e8a64, its five arrays in order ($VARs filled)
GPT3_EXAMPLE = """
--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048
--max-position-embeddings 2048 --attention-backend auto
--micro-batch-size 1 --global-batch-size 1536
--step-batch-size-schedule "0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536"
--train-iters 500000 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006
--clip-grad 1.0 --fp16 --lr 6.0e-5 --lr-decay-style cosine --min-lr 6.0e-6 --lr-warmup-fraction .001
--lr-decay-iters 430000
--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16
--data-path /data/gpt3_text_document --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt
--split 949,50,1
--log-interval 100 --save-interval 10000 --eval-interval 1000 --save /ckpt --load /ckpt
--eval-iters 10 --tensorboard-dir /tb
"""


def run(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_misspelt_flag_is_refused_naming_the_closest_real_one(capsys):
    rc, out, err = run(SMALL + ["--tensor-model-paralel-size", "2"], capsys)
    assert rc == 2 and out == ""
    assert "--tensor-model-paralel-size is not a Megatron-LM argument" in err
    assert "did you mean --tensor-model-parallel-size?" in err


def test_derived_virtual_pipeline_size_is_not_a_flag(capsys):
    rc, _, err = run(SMALL + ["--virtual-pipeline-model-parallel-size", "2"], capsys)
    assert rc == 2 and "validate_args derives it; give --num-virtual-stages-per-pipeline-rank" in err


def test_real_flags_that_do_not_change_the_estimate_are_listed_and_ignored(capsys):
    rc, plain, _ = run(SMALL, capsys)
    rc2, out, _ = run(SMALL + ["--lr", "6e-5", "--bf16", "--split=949,50,1", "--data-path", "a", "b"],
                      capsys)
    assert rc == rc2 == 0
    assert "(ignored, not used by the estimate: --lr --bf16 --split --data-path)" in out
    assert plain.splitlines()[-2:] == out.splitlines()[-2:]       # same report and FLOPs


def test_the_snapshots_gpt3_example_is_refused_as_megatron_refuses_it(capsys):
    # validate_args @ d98e8a64 raises on --step-batch-size-schedule with --global-batch-size, so
    # Megatron's own example script does not start at that commit: the estimate says the same.
    flags = ["--world-size", "1024", *shlex.split(GPT3_EXAMPLE)]
    rc, _, err = run(flags, capsys)
    assert rc == 2 and "Cannot specify both --step-batch-size-schedule and --global-batch-size" in err
    i = flags.index("--step-batch-size-schedule")
    rc, out, _ = run(flags[:i] + flags[i + 2:], capsys)
    assert rc == 0, out
    e = megatron_estimate(1024, num_layers=96, hidden_size=12288, num_attention_heads=96,
                          seq_length=2048, vocab_size=50257, micro_batch_size=1,
                          global_batch_size=1536, tensor_model_parallel_size=8,
                          pipeline_model_parallel_size=16)
    assert e["report"] in out and "vocab size 50257 from the GPT-2 BPE tokenizer" in out
    assert "--attention-backend --train-iters" in out and "--tensorboard-dir)" in out


def test_gpt3_175b_line_as_megatron_prints_it():
    flags = ["--world-size", "1024", "--num-layers", "96", "--hidden-size", "12288",
             "--num-attention-heads", "96", "--seq-length", "2048", "--max-position-embeddings", "2048",
             "--vocab-size", "51200", "--micro-batch-size", "1", "--global-batch-size", "1536",
             "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "16",
             "--sequence-parallel", "--recompute-activations", "--use-distributed-optimizer"]
    out = subprocess.run([sys.executable, "-m", "labkit", "estimate", *flags], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert ("Theoretical memory footprints: weight and optimizer=10284.62 MB, activation=9840.03 MB, "
            "total=20124.65 MB") in out.stdout


def test_store_false_switches_reach_the_estimate(capsys):
    moe = SMALL + ["--num-experts", "4", "--json"]
    rc, with_bias, _ = run(moe, capsys)
    rc2, without, _ = run(moe + ["--disable-bias-linear"], capsys)
    assert rc == rc2 == 0
    shard = [json.loads(o)["params_on_most_loaded_shard"]["replicated"] for o in (with_bias, without)]
    assert shard[0] - shard[1] == 2 * 4                       # the router bias of 2 MoE layers


@pytest.mark.parametrize("extra, message", [
    (["--sequence-parallel=1"], "--sequence-parallel takes no value"),
    (["--global-batch-size"], "--global-batch-size expects a value"),
    (["--hidden-size", "big"], "--hidden-size: invalid value 'big'"),
    (["stray"], "unexpected value 'stray'"),
    (["--checkpoint-activations"], "--checkpoint-activations is no longer valid"),
    (["--normalization", "BatchNorm"], "normalization must be one of"),
    (["--moe-layer-freq", "[1]*2+__import__('os')"], "Invalid pattern"),
])
def test_bad_command_lines_are_errors_not_tracebacks(capsys, extra, message):
    rc, _, err = run(SMALL + extra, capsys)
    assert rc == 2 and message in err


def test_world_size_is_required(capsys):
    rc, _, err = run(SMALL[2:], capsys)
    assert rc == 2 and "--world-size N is required" in err


def test_vocabulary_from_the_tokenizer(capsys):
    base = [f for f in SMALL if f not in ("--vocab-size", "256")]
    rc, _, err = run(base, capsys)
    assert rc == 2 and "--vocab-size" in err
    rc, out, _ = run(base + ["--tokenizer-type", "GPT2BPETokenizer"], capsys)
    assert rc == 0 and "padded vocab size: 50304" in out
    rc, _, err = run(base + ["--tokenizer-type", "HuggingFaceTokenizer", "--vocab-file", "v"], capsys)
    assert rc == 2


def test_moe_layer_freq_is_parsed_as_megatron_parses_it():
    used, _, _ = parse_flags(["--moe-layer-freq", "([0]+[1])*2"])
    assert used == {"moe_layer_freq": [0, 1, 0, 1]}
    used, _, _ = parse_flags(["--moe-layer-freq", "[0]*3+[1]*58", "--num-layers", "61"])
    assert used["moe_layer_freq"] == [0] * 3 + [1] * 58            # DeepSeek-V3's, as in Megatron's examples
    with pytest.raises(ValueError, match=r"--moe-layer-freq: .* makes a list of 61 entries, more than num_layers 60"):
        parse_flags(["--num-layers", "60", "--moe-layer-freq", "[0]*3+[1]*58"])


def test_flag_table_is_megatrons():
    # 839 parser actions at d98e8a64 -> 876 flag spellings (aliases such as --disable-tp-comm-*)
    assert len(FLAGS) == 876
    assert FLAGS["disable-bias-linear"] == ("add_bias_linear", "switch", False)
    assert FLAGS["no-overlap-p2p-communication"] == ("overlap_p2p_comm", "switch", False)
    assert FLAGS["data-parallel-sharding-strategy"][:2] == ("data_parallel_sharding_strategy", "value")
    assert FLAGS["data-path"][1] == "list"
    assert all(name.replace("_", "-") in FLAGS or name in {d for d, _, _ in FLAGS.values()}
               for name in ESTIMATE_DEFAULTS)
