"""Bytes each rank sends, per collective and per parallel strategy, and what that costs on a link.

Chapter "Collectives" (ring algorithms, the alpha-beta model) and every strategy chapter (DP/ZeRO,
TP, SP, CP, PP, EP). Counts are bytes SENT by one rank under the textbook ring algorithms
(Patarasuk & Yuan 2009; Thakur et al. 2005). ``N`` is always the byte size of the full, unsharded
tensor and ``n`` the group size; a group of one sends nothing.

    all-reduce      = reduce-scatter + all-gather   2(n-1)/n * N
    all-gather      (n-1)/n * N      each rank sends its N/n shard to n-1 peers (in n-1 ring hops)
    reduce-scatter  (n-1)/n * N      each rank sends n-1 partial shards of size N/n
    all-to-all      (n-1)/n * N      each rank keeps 1/n of its N and sends the rest

Pure Python, no torch: the labs compare the bytes ``labkit.comm`` counts against these numbers.
"""
from __future__ import annotations

import math
import numbers

from ..validate import positive_int

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def _check_size(name, value):
    """A byte count, size or element width: a finite number >= 0 (a nan or a negative size would
    come back as nan or negative bytes)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def _check_sizes(**sizes) -> None:
    for name, value in sizes.items():
        _check_size(name, value)


def ring_all_reduce_bytes(n_bytes, n) -> float:
    """Bytes one rank sends in a ring all-reduce of an N-byte tensor over n ranks: 2(n-1)/n * N."""
    _check_size("n_bytes", n_bytes)
    n = positive_int("group size", n)
    return 2.0 * (n - 1) / n * n_bytes


def all_gather_bytes(n_bytes, n) -> float:
    """Bytes one rank sends in a ring all-gather whose OUTPUT is N bytes: (n-1)/n * N."""
    _check_size("n_bytes", n_bytes)
    n = positive_int("group size", n)
    return (n - 1) / n * n_bytes


def reduce_scatter_bytes(n_bytes, n) -> float:
    """Bytes one rank sends in a ring reduce-scatter whose INPUT is N bytes: (n-1)/n * N."""
    _check_size("n_bytes", n_bytes)
    n = positive_int("group size", n)
    return (n - 1) / n * n_bytes


def all_to_all_bytes(n_bytes, n) -> float:
    """Bytes one rank sends in an all-to-all of its N-byte input: (n-1)/n * N (1/n stays home)."""
    _check_size("n_bytes", n_bytes)
    n = positive_int("group size", n)
    return (n - 1) / n * n_bytes


# --------------------------------------------------------------------------- per strategy
def dp_step_bytes(param_bytes, dp, zero_stage=0, grad_bytes=None, num_microbatches=1, gather_bytes=None) -> dict:
    """Bytes one data-parallel rank sends per optimizer step, by collective (chapter "Data parallel");
    ``gather_bytes``: what the parameter all-gathers carry in place of P (``fp8_gather_bytes``).

    P = ``param_bytes`` (all parameters of one replica), G = ``grad_bytes`` (defaults to P: the
    labs train in fp32, so gradients have the parameters' size), m = ``num_microbatches``.

    - stage 0 (plain DP):    all-reduce the gradients once           {"all_reduce": 2(n-1)/n G}
    - stage 1 (ZeRO-1):      reduce-scatter the accumulated gradients once, each rank updates its
      shard, all-gather the updated parameters once  {"reduce_scatter": (n-1)/n G, "all_gather": (n-1)/n P}
    - stage 2 (ZeRO-2):      a full gradient is never kept, so every microbatch's gradients are
      reduce-scattered: {"reduce_scatter": m (n-1)/n G, "all_gather": (n-1)/n P}
    - stage 3 (ZeRO-3/FSDP): reduce-scatter after every microbatch; parameters all-gathered before
      every forward and every backward (they are freed in between), never after the step
      {"reduce_scatter": m (n-1)/n G, "all_gather": 2m (n-1)/n P}

    With m = 1, stage 1/2 move the same bytes as plain DP (Rajbhandari et al. 2020, Sec. 7) and
    stage 3 moves 1.5x; gradient accumulation multiplies the cost of stages 2 and 3 only.
    """
    g = param_bytes if grad_bytes is None else grad_bytes
    param_bytes = param_bytes if gather_bytes is None else gather_bytes     # what the gathers carry
    _check_sizes(param_bytes=param_bytes, grad_bytes=g)
    m = num_microbatches
    positive_int("num_microbatches", m)
    if zero_stage == 0:
        return {"all_reduce": ring_all_reduce_bytes(g, dp)}
    if zero_stage == 1:
        return {"reduce_scatter": reduce_scatter_bytes(g, dp), "all_gather": all_gather_bytes(param_bytes, dp)}
    if zero_stage == 2:
        return {"reduce_scatter": m * reduce_scatter_bytes(g, dp), "all_gather": all_gather_bytes(param_bytes, dp)}
    if zero_stage == 3:
        return {"reduce_scatter": m * reduce_scatter_bytes(g, dp),
                "all_gather": 2 * m * all_gather_bytes(param_bytes, dp)}
    raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")


def tp_layer_bytes(seq_length, micro_batch_size, hidden_size, tp, bytes_per_element=4,
                   sequence_parallel=False) -> dict:
    """Bytes one TP rank sends per transformer layer per microbatch, forward + backward.

    The activation exchanged is the full [s, b, h] tensor, N = s*b*h*bytes (chapter "Tensor
    parallel", Shoeybi et al. 2019, Fig. 4):

    - TP: forward all-reduces after ``linear_proj`` and ``linear_fc2`` (operator g); backward
      all-reduces the input gradients before ``linear_qkv`` and ``linear_fc1`` (operator f):
      4 all-reduces          -> {"all_reduce": 4 * 2(t-1)/t * N}
    - TP+SP (Korthikanti et al. 2022, Sec. 4.2.2): each all-reduce becomes an all-gather into the
      column-parallel linear and a reduce-scatter out of the row-parallel one. Forward: 2
      all-gathers + 2 reduce-scatters; backward the conjugates, 2 reduce-scatters + 2 all-gathers
                             -> {"all_gather": 4 (t-1)/t N, "reduce_scatter": 4 (t-1)/t N}
      Same bytes as TP. (Megatron-LM additionally re-gathers the sequence-sharded input in the
      backward for the weight gradient instead of keeping it; that extra all-gather is not counted.)
    """
    _check_sizes(seq_length=seq_length, micro_batch_size=micro_batch_size, hidden_size=hidden_size,
                 bytes_per_element=bytes_per_element)
    n_bytes = seq_length * micro_batch_size * hidden_size * bytes_per_element
    if sequence_parallel:
        return {"all_gather": 4 * all_gather_bytes(n_bytes, tp),
                "reduce_scatter": 4 * reduce_scatter_bytes(n_bytes, tp)}
    return {"all_reduce": 4 * ring_all_reduce_bytes(n_bytes, tp)}


def pp_step_bytes(seq_length, micro_batch_size, hidden_size, num_microbatches, pp, stage,
                  bytes_per_element=4, virtual_pipeline_size=1) -> dict:
    """Bytes pipeline rank ``stage`` sends per optimizer step (chapter "Pipeline parallel").

    Every microbatch crosses every boundary between consecutive model chunks: activations
    [s, b, h] forward, their gradients (same shape) backward. With ``virtual_pipeline_size`` = v
    the rank holds v chunks at global positions ``j*pp + stage``; a chunk sends forward unless it
    is the very last chunk and backward unless it is the very first.

        {"send_forward": m * k_fwd * N, "send_backward": m * k_bwd * N},  N = s*b*h*bytes
    """
    positive_int("pp", pp)
    positive_int("virtual_pipeline_size", virtual_pipeline_size)
    _check_sizes(seq_length=seq_length, micro_batch_size=micro_batch_size, hidden_size=hidden_size,
                 num_microbatches=num_microbatches, bytes_per_element=bytes_per_element)
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < pp:
        raise ValueError(f"stage must be an integer in [0, pp={pp}), got {stage!r}")
    v = virtual_pipeline_size
    n_bytes = seq_length * micro_batch_size * hidden_size * bytes_per_element
    chunks = [j * pp + stage for j in range(v)]
    k_fwd = sum(1 for c in chunks if c != v * pp - 1)
    k_bwd = sum(1 for c in chunks if c != 0)
    return {"send_forward": float(num_microbatches * k_fwd * n_bytes),
            "send_backward": float(num_microbatches * k_bwd * n_bytes)}


CP_COMM_TYPES = ("p2p", "all_gather", "a2a")  # Megatron's TransformerConfig.cp_comm_type (no "a2a+p2p")
CP_COMM_ALIASES = {"allgather": "all_gather"}  # the spelling of --cp-comm-type's help text


def cp_attention_bytes(seq_length, micro_batch_size, kv_hidden_size, cp, bytes_per_element=4,
                       cp_comm_type="p2p", hidden_size=None) -> dict:
    """Bytes one CP rank sends in one layer's attention per microbatch, {"forward": {op: bytes},
    "backward": {op: bytes}} (chapter "Context parallelism"; labkit/context_parallel/).

    Sizes are per TP rank: ``kv_hidden_size`` = kv_channels * num_query_groups / t (h/t without
    GQA), ``hidden_size`` = the queries' width h/t (default: kv_hidden_size). A rank holds s/c
    tokens; its K and V are kv = 2 * s/c * b * kv_hidden * bytes.

    - "p2p" (ring): forward c-1 sends of K/V; backward c-1 sends of K/V (not kept from the forward)
      and c-1 sends of the dK/dV accumulators            {"send_recv": (c-1) kv | 2 (c-1) kv}
    - "all_gather": forward all-gathers K/V (N = c kv gathered); backward gathers them again and
      reduce-scatters dK/dV                               (c-1)/c N each: the ring's bytes
    - "a2a" (Ulysses): q, k, v go out in an all-to-all, the output comes back in another; the
      backward moves their gradients: {"all_to_all": (c-1)/c * s/c * b * (2 hq + 2 hkv) * bytes}
      each way.
    For a fixed s the ring's total 3 (c-1) kv = 6 (c-1)/c * s b hkv elements, 12 (c-1)/c * s b hkv
    bytes in 16-bit, hardly changes with c; the all-to-alls' falls as 1/c (Jacobs et al. 2023).
    """
    positive_int("cp", cp)
    _check_sizes(seq_length=seq_length, micro_batch_size=micro_batch_size, kv_hidden_size=kv_hidden_size,
                 bytes_per_element=bytes_per_element, hidden_size=hidden_size or 0)
    cp_comm_type = CP_COMM_ALIASES.get(cp_comm_type, cp_comm_type)
    if cp_comm_type not in CP_COMM_TYPES:
        raise ValueError(f"cp_comm_type must be one of {CP_COMM_TYPES}, got {cp_comm_type!r}")
    hq = kv_hidden_size if hidden_size is None else hidden_size
    tokens = seq_length / cp * micro_batch_size
    kv = 2 * tokens * kv_hidden_size * bytes_per_element
    if cp_comm_type == "p2p":                               # every formula is 0 when c = 1
        return {"forward": {"send_recv": (cp - 1) * kv}, "backward": {"send_recv": 2.0 * (cp - 1) * kv}}
    if cp_comm_type == "all_gather":
        gathered = all_gather_bytes(cp * kv, cp)
        return {"forward": {"all_gather": gathered},
                "backward": {"all_gather": gathered, "reduce_scatter": reduce_scatter_bytes(cp * kv, cp)}}
    moved = all_to_all_bytes(tokens * (2 * hq + 2 * kv_hidden_size) * bytes_per_element, cp)
    return {"forward": {"all_to_all": moved}, "backward": {"all_to_all": moved}}


def cp_layer_bytes(seq_length, micro_batch_size, kv_hidden_size, cp, bytes_per_element=4,
                   cp_comm_type="p2p", hidden_size=None) -> dict:
    """Bytes one CP rank sends per layer per microbatch, forward + backward, by op: the sum of
    :func:`cp_attention_bytes`. Ring attention (Megatron's default "p2p") passes K/V c-1 hops
    forward and K/V plus dK/dV c-1 hops backward: {"send_recv": 3 (c-1) kv}."""
    parts = cp_attention_bytes(seq_length, micro_batch_size, kv_hidden_size, cp, bytes_per_element,
                               cp_comm_type, hidden_size)
    total: dict = {}
    for phase in parts.values():
        for op, b in phase.items():
            total[op] = total.get(op, 0.0) + b
    return total


def ep_layer_bytes(seq_length, micro_batch_size, hidden_size, ep, moe_router_topk=1,
                   bytes_per_element=4) -> dict:
    """Bytes one EP rank sends per MoE layer per microbatch (chapter "Expert parallelism").

    The rank's s*b tokens, each copied to its top-k experts (N = s*b*k*h*bytes), go out in an
    all-to-all (dispatch) and come back in another (combine); the backward repeats both for the
    gradients: 4 all-to-alls, assuming tokens spread evenly over experts.
    """
    _check_sizes(seq_length=seq_length, micro_batch_size=micro_batch_size, hidden_size=hidden_size,
                 moe_router_topk=moe_router_topk, bytes_per_element=bytes_per_element)
    n_bytes = seq_length * micro_batch_size * moe_router_topk * hidden_size * bytes_per_element
    return {"all_to_all": 4 * all_to_all_bytes(n_bytes, ep)}


def expert_tp_layer_bytes(seq_length, micro_batch_size, hidden_size, etp, moe_router_topk=1,
                          bytes_per_element=4) -> dict:
    """Bytes one rank sends per MoE layer per microbatch over the expert-tensor-parallel group
    (``expert_tensor_parallel_size`` etp > 1, chapter "Expert parallelism"), balanced router: the
    N = s b k h bytes of rows it holds after the all-to-all are all-gathered to the etp ranks (each
    computes every row on its slice of the expert) and the partial outputs reduce-scattered back;
    the backward does the conjugates. Unlike EP's (ep - 1)/ep, this grows with etp - 1."""
    positive_int("etp", etp)
    _check_sizes(seq_length=seq_length, micro_batch_size=micro_batch_size, hidden_size=hidden_size,
                 moe_router_topk=moe_router_topk, bytes_per_element=bytes_per_element)
    n_bytes = seq_length * micro_batch_size * moe_router_topk * hidden_size * bytes_per_element
    return {"all_gather": 2.0 * (etp - 1) * n_bytes, "reduce_scatter": 2.0 * (etp - 1) * n_bytes}


def ep_routed_bytes(rows_to_others, rows_from_others, hidden_size, bytes_per_element=4) -> dict:
    """Bytes one EP rank sends per MoE layer per microbatch for the rows it really routes (chapter
    "Expert parallelism"): its rows to other ranks (dispatch), the rows it received going back
    (combine), and the same two again as gradients in the backward. A balanced router gives
    ``ep_layer_bytes``; an imbalanced one makes some ranks send (and receive) more."""
    _check_sizes(rows_to_others=rows_to_others, rows_from_others=rows_from_others,
                 hidden_size=hidden_size, bytes_per_element=bytes_per_element)
    return {"all_to_all": 2.0 * (rows_to_others + rows_from_others) * hidden_size * bytes_per_element}


def ep_allgather_layer_bytes(seq_length, micro_batch_size, hidden_size, num_experts, n,
                             bytes_per_element=4) -> dict:
    """Bytes one rank sends per MoE layer per microbatch with the all-gather dispatcher over n
    ranks (etp x ep; Megatron's ``MoEAllGatherTokenDispatcher``). Forward: all-gather the tokens
    [T, h], the probabilities [T, E] and the 1-byte routing map, reduce-scatter the output [n T, h];
    backward: reduce-scatter the token and probability gradients, all-gather the output's."""
    positive_int("group size", n)
    _check_sizes(seq_length=seq_length, micro_batch_size=micro_batch_size, hidden_size=hidden_size,
                 num_experts=num_experts, bytes_per_element=bytes_per_element)
    t = seq_length * micro_batch_size
    tokens, probs, routing_map = t * hidden_size * bytes_per_element, t * num_experts * bytes_per_element, t * num_experts
    return {"all_gather": (n - 1) * (tokens + probs + routing_map + tokens),
            "reduce_scatter": (n - 1) * (tokens + tokens + probs)}


# --------------------------------------------------------------------------- time on a link
def ring_steps(op: str, n: int) -> int:
    """Number of sequential ring hops (each paying the latency alpha) of a collective."""
    n = positive_int("group size", n)
    steps = {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1,
             "all_to_all": n - 1, "send_recv": 1, "send_forward": 1, "send_backward": 1}
    if op not in steps:
        raise ValueError(f"op must be one of {tuple(steps)}, got {op!r}")
    return 0 if n == 1 else steps[op]


def alpha_beta_time(n_bytes_sent, bandwidth, latency=0.0, steps=1) -> float:
    """Time of a transfer in the alpha-beta model: steps * alpha + bytes / beta (seconds).

    ``bandwidth`` in bytes/s per direction of the rank's link, ``latency`` (alpha) in seconds.
    """
    _check_sizes(n_bytes_sent=n_bytes_sent, latency=latency, steps=steps)
    if not _check_size("bandwidth", bandwidth):
        raise ValueError(f"bandwidth must be positive, got {bandwidth!r}")
    return steps * latency + n_bytes_sent / bandwidth


def collective_time(op, n_bytes, n, bandwidth, latency=0.0) -> float:
    """Alpha-beta time of one ring collective on N bytes over n ranks, e.g. ("all_reduce", ...)."""
    if op not in COLLECTIVES:
        raise ValueError(f"op must be one of {COLLECTIVES}, got {op!r}")
    sent = {"all_reduce": ring_all_reduce_bytes, "all_gather": all_gather_bytes,
            "reduce_scatter": reduce_scatter_bytes, "all_to_all": all_to_all_bytes}[op](n_bytes, n)
    return alpha_beta_time(sent, bandwidth, latency, ring_steps(op, n))
