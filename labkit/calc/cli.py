"""``python -m labkit estimate`` / ``plan``: Megatron-LM's numbers from Megatron-LM's flags.

    python -m labkit estimate --world-size 1024 --num-layers 96 --hidden-size 12288 \\
        --num-attention-heads 96 --seq-length 2048 --vocab-size 51200 --micro-batch-size 1 \\
        --global-batch-size 1536 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 \\
        --sequence-parallel --recompute-activations --use-distributed-optimizer

Paste a whole ``pretrain_gpt.py`` command line: flags the estimate does not use are listed and
ignored. Prints the line Megatron prints ("Theoretical memory footprints: ...") and the FLOPs.
"""
from __future__ import annotations

import argparse
import json
import sys

from .megatron import DEFAULTS, megatron_estimate

_BOOL = {k for k, v in DEFAULTS.items() if v is False} | {"group_query_attention"}
_STR = {"normalization", "recompute_granularity"}


def _freq(text):
    """--moe-layer-freq: an int, or a list expression like ([1]*3+[0])*2 (digits, [],()+* only)."""
    if all(ch in "0123456789[](),+* " for ch in text) and "[" in text:
        return list(eval(text, {"__builtins__": {}}))  # noqa: S307 - characters checked above
    return int(text)


def estimate_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m labkit estimate",
                                 description="Megatron-LM's theoretical memory and FLOPs, exactly.")
    ap.add_argument("--world-size", type=int, required=True, help="GPUs (WORLD_SIZE)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    for name in ("num_layers", "hidden_size", "num_attention_heads"):
        ap.add_argument("--" + name.replace("_", "-"), dest=name, type=int, required=True)
    for name, default in DEFAULTS.items():
        flag = "--" + name.replace("_", "-")
        if name in _BOOL:
            ap.add_argument(flag, dest=name, action="store_true", default=None)
        elif name in _STR:
            ap.add_argument(flag, dest=name, type=str, default=None)
        elif name == "moe_layer_freq":
            ap.add_argument(flag, dest=name, type=_freq, default=None)
        else:
            ap.add_argument(flag, dest=name, type=int, default=None)
    return ap


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, unknown = estimate_parser().parse_known_args(argv)
    kw = {k: v for k, v in vars(args).items() if v is not None and k not in ("world_size", "json")}
    kw.setdefault("group_query_attention", False)  # as in Megatron: groups count only with the flag
    note = None
    if "vocab_size" not in kw and "padded_vocab_size" not in kw:
        # Megatron reads the vocabulary from the tokenizer; pretrain_gpt.py's usual one is GPT-2 BPE.
        gpt2 = any(u.startswith("--vocab-file") or u == "GPT2BPETokenizer" for u in unknown)
        if gpt2:
            kw["vocab_size"], note = 50257, "vocab size 50257 from the GPT-2 BPE tokenizer (--vocab-file)"
        else:
            print("error: the vocabulary size comes from the tokenizer: pass --vocab-size N "
                  "(GPT-2 BPE: 50257) or Megatron's --vocab-file", file=sys.stderr)
            return 2
    try:
        est = megatron_estimate(world_size=args.world_size, **kw)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    ignored = [u for u in unknown if u.startswith("--")]
    if args.json:
        print(json.dumps({k: v for k, v in est.items() if k != "report"} | {"ignored": ignored}))
        return 0
    if ignored:
        print(f"(ignored, not used by the estimate: {' '.join(ignored)})")
    if note:
        print(f"({note})")
    print(f"data-parallel size: {est['data_parallel_size']}, "
          f"number of microbatches: {est['num_microbatches']}, "
          f"padded vocab size: {est['padded_vocab_size']}")
    print(f"activation formula: {est['activation_formula']}")
    print(est["report"])
    print(f"FLOPs per iteration: {est['flops_per_iteration']:.6e}")
    return 0


def plan_main(argv=None) -> int:
    """``python -m labkit plan --model gpt3-175b --cluster jean-zay-v100 --nodes 32 --global-batch-size 128``."""
    from .hardware import CLUSTERS, cluster
    from .planner import explain, plan
    from .presets import MODELS, model
    ap = argparse.ArgumentParser(prog="python -m labkit plan",
                                 description="Rank the layouts that fit by predicted throughput.")
    ap.add_argument("--model", required=True, choices=sorted(MODELS))
    ap.add_argument("--cluster", required=True, choices=sorted(CLUSTERS))
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--global-batch-size", type=int, required=True)
    ap.add_argument("--seq-length", type=int, default=None)
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        m = model(args.model)
        if args.seq_length:
            m = m.with_(seq_length=args.seq_length)
        c = cluster(args.cluster, args.nodes)
        result = plan(m, c, args.global_batch_size)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{len(result['ranked'])} layouts fit, {result['too_big']} do not fit, "
          f"{result['invalid']} break a rule")
    for r in result["ranked"][: args.top]:
        print(f"TP={r['tp']} PP={r['pp']} DP={r['dp']} mb={r['micro_batch_size']} "
              f"recompute={r['recompute']}: {r['tokens_per_s']:.0f} tokens/s, MFU {r['mfu']:.1%}, "
              f"{r['peak_memory_gib']:.1f} GiB")
    for line in explain(result, c):
        print(line)
    return 0
