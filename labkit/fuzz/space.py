"""The space the fuzzer draws from: every axis and knob ``labkit.train`` accepts, on cheap shapes.

Chapter "Finding the bug nobody chose". :func:`layouts` is a Hypothesis strategy of
``{"world_size", "implementation", "config"}`` (``config``: keyword arguments of ``labkit.train``,
Megatron's names). It draws the axes first (TP 1-4 with or without SP, CP 1-4 with each
``cp_comm_type``, PP 1-4 with VPP and each schedule, DP with ZeRO 0-3, the distributed optimizer and
bucket sizes, MoE with EP/ETP, top-k, capacity, shared experts and each dispatcher), their product
is the world size (1-8), then the model (the GPT-2 and Llama families, GQA with groups below, at
and above TP, tied or untied, a vocabulary padded so TP does not divide 256, recompute, dropout,
microbatches, sequence length, float32 or float64). Nothing here decides validity: a drawn
layout is either refused by the one rule book (:func:`refusal`: ``labkit.config.check`` with
Megatron's ``calc.config.validate``, and for the native path ``check_native``) or it must run.

Shapes are tiny (hidden 16-48, 1-4 layers, sequences of 8-16) because the oracle is exact: a
bug shows at any size, and a cheap layout is more layouts per minute.
"""
from __future__ import annotations

from hypothesis import strategies as st

from ..pipeline_parallel.placement import SCHEDULES

IMPLEMENTATIONS = ("labkit", "native", "megatron")
LLAMA = dict(normalization="RMSNorm", swiglu=True, position_embedding_type="rope", add_bias_linear=False)


@st.composite
def axes(draw, max_world: int = 8) -> dict:
    """TP, CP, PP (+VPP, schedule), EP and DP with their knobs, world = tp x cp x pp x dp <= max_world."""
    tp = draw(st.sampled_from([t for t in (1, 1, 2, 2, 4) if t <= max_world]))
    cp = draw(st.sampled_from([c for c in (1, 1, 2, 4) if tp * c <= max_world]))
    pp = draw(st.sampled_from([p for p in (1, 1, 2, 4) if tp * cp * p <= max_world]))
    dp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if tp * cp * pp * d <= max_world]))
    c = dict(tensor_model_parallel_size=tp, context_parallel_size=cp, pipeline_model_parallel_size=pp)
    if tp > 1:
        c["sequence_parallel"] = draw(st.booleans())
    if cp > 1:
        c["cp_comm_type"] = draw(st.sampled_from(["p2p", "all_gather", "a2a"]))
    if pp > 1:
        v = draw(st.sampled_from([1, 2]))
        layers = pp * v * draw(st.sampled_from([1, 1, 2]))
        c["num_layers"] = layers
        if v > 1:
            c["num_layers_per_virtual_pipeline_stage"] = layers // (pp * v)
        else:
            c["pipeline_schedule"] = draw(st.sampled_from([None] + sorted(s for s in SCHEDULES if SCHEDULES[s][2] == 1)))
    if dp * cp > 1:
        zero = draw(st.sampled_from([0, 0, 1, 2, 3]))
        if zero == 1 and draw(st.booleans()):
            c["use_distributed_optimizer"] = True
        elif zero:
            c["zero_stage"] = zero
        elif draw(st.booleans()):
            c["ddp_bucket_size"] = draw(st.sampled_from([64, 1000, 10 ** 6]))
    return {"world_size": tp * cp * pp * dp, "config": c}


@st.composite
def moe(draw, tp: int, world: int, cp: int, pp: int) -> dict:
    """MoE arguments: experts, EP (a divisor of what the layout leaves), ETP, top-k, capacity."""
    if cp > 1 or not draw(st.booleans()):
        return {}
    experts = draw(st.sampled_from([2, 4]))
    room = world // (pp * tp)          # EP within the expert side of the grid
    ep = draw(st.sampled_from([e for e in (1, 2, 4) if experts % e == 0 and room % e == 0] or [1]))
    c = dict(num_experts=experts, expert_model_parallel_size=ep, moe_router_topk=draw(st.sampled_from([1, 2])),
             moe_token_dispatcher_type=draw(st.sampled_from(["allgather", "alltoall"])))
    if tp > 1 and draw(st.booleans()):
        c["expert_tensor_parallel_size"] = 1
    if draw(st.booleans()):
        c["moe_expert_capacity_factor"] = draw(st.sampled_from([1.0, 1.5]))
    if draw(st.booleans()):
        c["moe_shared_expert_intermediate_size"] = 32
    return c


@st.composite
def model(draw, tp: int, pp_layers: int | None) -> dict:
    """The model: family, heads and query groups against TP, tying, vocabulary padding, sizes."""
    heads = draw(st.sampled_from([h for h in (2, 4, 8) if h % tp == 0] or [tp]))
    c = dict(num_attention_heads=heads, hidden_size=heads * draw(st.sampled_from([4, 8])),
             seq_length=draw(st.sampled_from([8, 16])), num_layers=pp_layers or draw(st.sampled_from([1, 2])))
    if draw(st.booleans()):                                   # the Llama family
        c.update(LLAMA, ffn_hidden_size=3 * c["hidden_size"])   # Megatron's SwiGLU default rounds to 0 here
        g = draw(st.sampled_from(sorted({1, max(1, tp // 2), tp, heads})))   # g < t, g = t, g > t
        if g != heads:
            c.update(group_query_attention=True, num_query_groups=g)
        c["untie_embeddings_and_output_weights"] = draw(st.booleans())
    elif draw(st.booleans()):
        c["untie_embeddings_and_output_weights"] = True
    c["make_vocab_size_divisible_by"] = draw(st.sampled_from([128, 64, 96]))   # 96: 256 is padded
    return c


@st.composite
def knobs(draw, num_layers: int, pp: int, v: int) -> dict:
    """Batch, recompute, dropout and dtype."""
    c = dict(micro_batch_size=draw(st.sampled_from([1, 2])))
    c["_microbatches"] = draw(st.sampled_from([1, 2, 3]))
    kind = draw(st.sampled_from([None, None, "full", "selective"]))
    if kind == "full":
        c.update(recompute_granularity="full", recompute_method=draw(st.sampled_from(["uniform", "block"])),
                 recompute_num_layers=1)
    elif kind == "selective":
        c.update(recompute_granularity="selective",
                 recompute_modules=tuple(sorted(draw(st.sets(st.sampled_from(["core_attn", "mlp", "layernorm"]), min_size=1)))))
    if draw(st.integers(0, 7)) == 0:
        c["hidden_dropout"] = 0.1
    c["params_dtype"] = draw(st.sampled_from(["float64"] * 4 + ["float32"]))
    return c


@st.composite
def layouts(draw, implementations=("labkit",), max_world: int = 8) -> dict:
    """A whole layout: {"world_size", "implementation", "config"}; see the module docstring."""
    a = draw(axes(max_world))
    c, world = a["config"], a["world_size"]
    tp, cp, pp = c["tensor_model_parallel_size"], c["context_parallel_size"], c["pipeline_model_parallel_size"]
    v = 1 + (c.get("num_layers_per_virtual_pipeline_stage") is not None)
    c.update(draw(model(tp, c.pop("num_layers", None))))
    c.update(draw(moe(tp, world, cp, pp)))
    k = draw(knobs(c["num_layers"], pp, v))
    dp = world // (tp * cp * pp)
    m = k.pop("_microbatches")
    if v > 1:                                   # interleaving: microbatches a multiple of pp (Megatron's rule)
        m = pp * draw(st.sampled_from([1, 2]))
    if m > 1 or draw(st.booleans()):
        k["global_batch_size"] = k["micro_batch_size"] * dp * m
    c.update(k)
    defaults = dict(sequence_parallel=False, cp_comm_type="p2p", tensor_model_parallel_size=1,
                    context_parallel_size=1, pipeline_model_parallel_size=1, pipeline_schedule=None)
    c = {key: val for key, val in c.items() if defaults.get(key, object()) != val}
    return {"world_size": world, "implementation": draw(st.sampled_from(list(implementations))), "config": c}


def refusal(layout: dict) -> str | None:
    """The rule that refuses ``layout`` (its ValueError's message), or None when it must run.
    The megatron path's own refusals come from ``labkit.train`` itself (the run is then refused)."""
    from ..config import train_config
    try:
        cfg = train_config(**layout["config"])
        if layout["implementation"] == "native":
            from ..native.options import check_native, resolve
            check_native(cfg, layout["world_size"], resolve("native"))
        else:
            cfg.validate(layout["world_size"])
    except ValueError as e:
        return str(e)
    return None


def describe(layout: dict) -> str:
    """One line: the world and every non-default field (the shrunk layout's name in a report)."""
    c = layout["config"]
    short = {"tensor_model_parallel_size": "tp", "context_parallel_size": "cp", "pipeline_model_parallel_size": "pp",
             "expert_model_parallel_size": "ep", "expert_tensor_parallel_size": "etp",
             "num_layers_per_virtual_pipeline_stage": "vpp_layers", "sequence_parallel": "sp"}
    parts = [f"{short.get(k, k)}={v}" for k, v in sorted(c.items())]
    impl = "" if layout["implementation"] == "labkit" else f" [{layout['implementation']}]"
    return f"world {layout['world_size']}: " + ", ".join(parts) + impl
