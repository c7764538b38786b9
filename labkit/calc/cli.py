"""``python -m labkit estimate`` / ``plan``: Megatron-LM's numbers from Megatron-LM's flags.

    python -m labkit estimate --world-size 1024 --num-layers 96 --hidden-size 12288 \\
        --num-attention-heads 96 --seq-length 2048 --vocab-size 51200 --micro-batch-size 1 \\
        --global-batch-size 1536 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 \\
        --sequence-parallel --recompute-activations --use-distributed-optimizer

Paste a whole ``pretrain_gpt.py`` command line: every flag is checked against Megatron-LM's own
argument list (``megatron_flags.py``, commit d98e8a64). A flag Megatron does not know is an error
that names the closest real one (``--tensor-model-paralel-size`` -> ``--tensor-model-parallel-size``);
real flags the estimate does not use are listed and ignored. Prints the line Megatron prints
("Theoretical memory footprints: ...") and the FLOPs. ``--world-size`` is labkit's (Megatron reads
the WORLD_SIZE environment variable).
"""
from __future__ import annotations

import json
import sys

from .megatron import megatron_estimate
from .megatron_args import DEPRECATED, FLAGS, NOT_COVERED, unknown_message
from .megatron_flags import ESTIMATE_DEFAULTS
from .moe import parse_layer_freq

_STR = {"normalization", "recompute_granularity", "position_embedding_type",
        "experimental_attention_variant", "hybrid_layer_pattern", "hybrid_override_pattern",
        "pipeline_model_parallel_layout", "step_batch_size_schedule"}
GPT2_BPE_VOCAB = 50257  # entries of gpt2-vocab.json, Megatron's GPT2BPETokenizer


def _typed(dest: str, flag: str, raw):
    if isinstance(raw, list) or dest in _STR or dest == "moe_layer_freq":   # the pattern: below
        return raw
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{flag}: invalid value {raw[:40]!r}{'...' if len(raw) > 40 else ''}") from None


def parse_flags(argv: list) -> tuple[dict, dict, list]:
    """Megatron flags -> (arguments the estimate reads, other arguments, ignored flag strings)."""
    used, other, ignored, i = {}, {}, [], 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--"):
            raise ValueError(f"unexpected value {token!r} (no flag before it takes a value)")
        name, eq, inline = token[2:].partition("=")
        if name not in FLAGS:
            raise ValueError(unknown_message("--" + name, cli=True))
        dest, kind, stored = FLAGS[name]
        i += 1
        if kind == "switch":
            if eq:
                raise ValueError(f"--{name} takes no value")
            value = stored
        elif eq:
            value = inline if kind == "value" else inline.split()
        elif kind == "value":
            if i == len(argv) or (argv[i].startswith("--")):
                raise ValueError(f"--{name} expects a value")
            value, i = argv[i], i + 1
        else:
            value = []
            while i < len(argv) and not argv[i].startswith("--"):
                value, i = value + [argv[i]], i + 1
        if dest in ESTIMATE_DEFAULTS or dest in NOT_COVERED or dest in DEPRECATED:
            used[dest] = value if kind == "switch" else _typed(dest, "--" + name, value)
        else:
            other[dest] = value
            ignored.append(token.split("=")[0])
    if isinstance(used.get("moe_layer_freq"), str):   # parsed once --num-layers is known: no list
        layers = used.get("num_layers")                # longer than the model is ever built
        layers = layers if isinstance(layers, int) and layers > 0 else None
        try:
            used["moe_layer_freq"] = parse_layer_freq(used["moe_layer_freq"], layers)
        except ValueError as err:
            raise ValueError(f"--moe-layer-freq: {err}") from None
    return used, other, ignored


def _vocabulary(kw: dict, other: dict) -> str | None:
    """Megatron takes the vocabulary from the tokenizer; the usual pretrain_gpt.py one is GPT-2's."""
    if "vocab_size" in kw or "padded_vocab_size" in kw:
        return None
    kind = other.get("tokenizer_type")
    if kind == "GPT2BPETokenizer" or (kind is None and "vocab_file" in other):
        kw["vocab_size"] = GPT2_BPE_VOCAB
        return f"vocab size {GPT2_BPE_VOCAB} from the GPT-2 BPE tokenizer (--vocab-file)"
    raise ValueError("the vocabulary size comes from the tokenizer: pass --vocab-size N "
                     "(GPT-2 BPE: 50257) or Megatron's --vocab-file with GPT2BPETokenizer")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    world, as_json, rest, i = None, False, [], 0
    while i < len(argv):  # labkit's own two options; everything else is Megatron's
        if argv[i] == "--json":
            as_json = True
        elif argv[i] == "--world-size" and i + 1 < len(argv):
            world, i = argv[i + 1], i + 1
        elif argv[i].startswith("--world-size="):
            world = argv[i].partition("=")[2]
        else:
            rest.append(argv[i])
        i += 1
    try:
        if world is None or not world.isdigit():
            raise ValueError("--world-size N is required (the number of GPUs, WORLD_SIZE)")
        kw, other, ignored = parse_flags(rest)
        note = _vocabulary(kw, other)
        est = megatron_estimate(world_size=int(world), **kw)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    notes = ([note] if note else []) + est["notes"]
    if as_json:
        out = {k: v for k, v in est.items() if k != "report"}
        print(json.dumps(out | {"ignored": ignored, "notes": notes}))
        return 0
    if ignored:
        print(f"(ignored, not used by the estimate: {' '.join(ignored)})")
    for line in notes:
        print(f"({line})")
    print(f"data-parallel size: {est['data_parallel_size']}, "
          f"number of microbatches: {est['num_microbatches']}, "
          f"padded vocab size: {est['padded_vocab_size']}")
    print(f"activation formula: {est['activation_formula']}; attention: {est['attention']}")
    print(est["report"])
    print(f"FLOPs per iteration: {est['flops_per_iteration']:.6e}")
    return 0


def plan_main(argv=None) -> int:
    """``python -m labkit plan --model gpt3-175b --cluster jean-zay-v100 --nodes 32 --global-batch-size 128``."""
    import argparse

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
    ap.add_argument("--context-parallel-sizes", type=int, nargs="+", default=[1],
                    help="CP sizes to search (default: 1, no context parallelism)")
    ap.add_argument("--attention", choices=["flash", "math"], default="flash",
                    help="attention kernel every layout's memory is counted with: flash (fused, "
                         "Megatron-Core's default) or math (materialized s x s scores)")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        m = model(args.model)
        if args.seq_length:
            m = m.with_(seq_length=args.seq_length)
        c = cluster(args.cluster, args.nodes)
        result = plan(m, c, args.global_batch_size, attention=args.attention,
                      context_parallel_sizes=tuple(args.context_parallel_sizes))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{len(result['ranked'])} layouts fit, {result['too_big']} do not fit, "
          f"{result['invalid']} break a rule (memory counted with {result['attention']} attention)")
    for r in result["ranked"][: args.top]:
        print(f"TP={r['tp']} PP={r['pp']} CP={r['cp']} DP={r['dp']} mb={r['micro_batch_size']} "
              f"recompute={r['recompute']}: {r['tokens_per_s']:.0f} tokens/s, MFU {r['mfu']:.1%}, "
              f"{r['peak_memory_gib']:.1f} GiB")
    for line in explain(result, c):
        print(line)
    return 0
