"""Where the time goes: the roofline of a GPU and of its links (chapter "Where the time goes").

An operation that does F FLOPs and moves B bytes through a memory (HBM) or over a link has an
*arithmetic intensity* I = F / B FLOPs per byte. On a device of peak P FLOP/s and bandwidth W
bytes/s it takes at least max(F / P, B / W) seconds and reaches at most min(P, I W) FLOP/s
(Williams, Waterman & Patterson 2009, doi:10.1145/1498765.1498785). The *ridge* I* = P / W
separates the memory-bound ops (I < I*) from the compute-bound ones.

A collective is placed on the same picture with the link as the "memory": its FLOPs are the
compute it has to hide behind (the layer's work on that rank), its bytes those one rank sends
(``labkit.calc.comm``). Below the link's ridge P / W the link, not the GPU, sets the pace.

Everything here is forward-pass bookkeeping of one transformer layer on one GPU, in 16-bit
(``bytes_per_element`` 2), unless a function says otherwise:

    layer_ops(model, tp, cp, micro_batch_size)    the GEMMs, the attention core and a norm
    comm_ops(model, layout, micro_batch_size)     TP, CP, EP per layer; DP / FSDP per layer per step
    crossover(axis, n, peak, bandwidth)           the closed forms: where an axis turns comm-bound

The crossovers assume the GPT layer of Shoeybi et al. 2019 (FFN 4h, no GQA) and no overlap; the
tests check each against comm_ops, which reads the bytes from ``labkit.calc.comm``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..validate import positive_int
from . import comm

AXES = ("dp", "fsdp", "tp", "cp", "ep")
# what the crossover of each axis is expressed in
CROSSOVER_UNITS = {"dp": "tokens per GPU per step", "fsdp": "tokens per GPU per step",
                   "tp": "hidden size h", "cp": "sequence length s", "ep": "expert FFN size"}


@dataclass(frozen=True)
class Op:
    """One operation: ``flops`` done, ``bytes`` moved through ``memory`` ("hbm" or a link name)."""

    name: str
    kind: str            # "gemm" | "attention" | "elementwise" | "collective"
    flops: float
    bytes: float
    memory: str = "hbm"

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes if self.bytes else float("inf")


def ridge(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOPs per byte) above which a device of these rates is compute-bound."""
    if peak_flops <= 0 or bandwidth <= 0:
        raise ValueError(f"peak_flops and bandwidth must be positive, got {peak_flops}, {bandwidth}")
    return peak_flops / bandwidth


def attainable_flops(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """The roofline: min(P, I W) FLOP/s."""
    return min(peak_flops, intensity * bandwidth)


def op_time(op: Op, peak_flops: float, bandwidth: float) -> float:
    """Lower bound on the seconds of ``op``: max(F / P, B / W)."""
    return max(op.flops / peak_flops, op.bytes / bandwidth)


def bound(op: Op, peak_flops: float, bandwidth: float) -> str:
    """"compute" when the op sits right of the ridge, else "memory" (or "link" for a collective)."""
    if op.intensity >= ridge(peak_flops, bandwidth):
        return "compute"
    return "link" if op.kind == "collective" else "memory"


def gemm_op(name: str, M: float, N: float, K: float, bytes_per_element: int = 2, count: float = 1) -> Op:
    """``count`` GEMMs of [M, K] x [K, N]: 2MNK FLOPs each, reading A and B and writing C once."""
    return Op(name, "gemm", count * 2.0 * M * N * K, count * bytes_per_element * (M * K + K * N + M * N))


def gemm_intensity(M: float, N: float, K: float, bytes_per_element: int = 2) -> float:
    """2MNK / (bytes (MK + KN + MN)): for a square GEMM n / 3 in 16-bit."""
    return gemm_op("", M, N, K, bytes_per_element).intensity


def layer_ops(model, tp: int = 1, cp: int = 1, micro_batch_size: int = 1, bytes_per_element: int = 2,
              ep: int = 1) -> list:
    """The forward of one layer on one GPU, op by op: T = s/cp * b tokens, TP cuts the heads and
    the FFN, a MoE layer sends each token to top-k of E experts spread over ``ep`` ranks.

    Attention is a fused (flash) causal kernel: 2 T s q/tp FLOPs (half of QK^T and AV), reading Q and
    the keys and values of the whole sequence once and writing O (the least traffic it can have).
    The norm: RMSNorm's ~4 FLOPs per element, one read and one write."""
    bpe, h, b, s = bytes_per_element, model.hidden_size, micro_batch_size, model.seq_length
    T = s / cp * b
    q = model.kv_channels * model.num_attention_heads
    kv = model.kv_channels * model.query_groups
    gate = 2 if model.swiglu else 1
    ops = [gemm_op("qkv", T, (q + 2 * kv) / tp, h, bpe),
           Op("attention", "attention", 2.0 * T * s * q / tp, bpe * (2 * T * q + 2 * s * b * kv) / tp),
           gemm_op("proj", T, h, q / tp, bpe)]
    if model.num_experts:
        E, k, f = model.num_experts, model.moe_router_topk, model.moe_ffn_hidden_size
        rows = ep * T * k / E               # tokens each expert sees (balanced router)
        local = E / ep                      # experts on this rank
        ops += [gemm_op("router", T, E, h, bpe),
                gemm_op("fc1", rows, f * gate / tp, h, bpe, local),
                gemm_op("fc2", rows, h, f / tp, bpe, local)]
    else:
        f = model.ffn_hidden_size
        ops += [gemm_op("fc1", T, f * gate / tp, h, bpe), gemm_op("fc2", T, h, f / tp, bpe)]
    ops.append(Op("norm", "elementwise", 4.0 * T * h, 2.0 * bpe * T * h))
    return ops


def _train_flops(ops, names) -> float:
    """Forward + backward FLOPs of the named ops: 3x the forward for GEMMs (input and weight
    gradients), 3.5x for attention (its backward does 2.5x the forward, as labkit.calc.gemm)."""
    return sum(o.flops * (3.5 if o.kind == "attention" else 3.0) for o in ops if o.name in names)


def layer_weight_bytes(model, tp: int = 1, bytes_per_element: int = 2) -> float:
    """Bytes of one dense layer's weight matrices on one TP rank (what DP all-reduces per layer)."""
    h, q = model.hidden_size, model.kv_channels * model.num_attention_heads
    kv = model.kv_channels * model.query_groups
    f, gate = model.ffn_hidden_size, (2 if model.swiglu else 1)
    return bytes_per_element * (h * (q + 2 * kv) + q * h + h * f * gate + f * h) / tp


def comm_ops(model, layout: dict, micro_batch_size: int = 1, bytes_per_element: int = 2,
             num_microbatches: int = 1) -> list:
    """The collectives of one layer, each an Op whose FLOPs are the work it must hide behind.

    ``layout``: {"tp", "cp", "ep", "dp", "fsdp"} sizes (missing = 1; "fsdp" is ZeRO-3 over its size,
    "dp" plain all-reduce). TP, CP, EP: per microbatch, forward + backward. DP, FSDP: per optimizer
    step of ``num_microbatches`` microbatches, against that step's GEMM FLOPs of the layer (6 x its
    weights x tokens; attention's 7 s / (72 h) more are left out, on the safe side)."""
    tp, cp, ep = (layout.get(a, 1) for a in ("tp", "cp", "ep"))
    bpe, b, s, h = bytes_per_element, micro_batch_size, model.seq_length, model.hidden_size
    ops = layer_ops(model, tp, cp, b, bpe, ep)
    gemms = ("qkv", "proj", "fc1", "fc2", "router")
    layer = _train_flops(ops, gemms)        # the "6N" FLOPs: attention's would hide a little more
    out = []
    if tp > 1:
        sent = sum(comm.tp_layer_bytes(s / cp, b, h, tp, bpe).values())
        out.append(Op("TP all-reduce", "collective", _train_flops(ops, gemms), sent, "tp"))
    if cp > 1:
        kv = model.kv_channels * model.query_groups / tp
        sent = sum(comm.cp_layer_bytes(s, b, kv, cp, bpe, "p2p").values())
        out.append(Op("CP ring K/V", "collective", _train_flops(ops, ("attention",)), sent, "cp"))
    if ep > 1 and model.num_experts:
        sent = sum(comm.ep_layer_bytes(s / cp, b, h, ep, model.moe_router_topk, bpe).values())
        out.append(Op("EP all-to-all", "collective", _train_flops(ops, ("fc1", "fc2")), sent, "ep"))
    weights = layer_weight_bytes(model, tp, bpe)
    for axis, stage, name in (("dp", 0, "DP all-reduce"), ("fsdp", 3, "FSDP gather/scatter")):
        n = layout.get(axis, 1)
        if n > 1:
            sent = sum(comm.dp_step_bytes(weights, n, stage, weights, num_microbatches).values())
            out.append(Op(name, "collective", num_microbatches * layer, sent, axis))
    return out


def crossover(axis: str, n: int, peak_flops: float, bandwidth: float, bytes_per_element: int = 2,
              swiglu: bool = False, kv_ratio: float = 1.0) -> float:
    """Where ``axis`` of size ``n`` on a link of ``bandwidth`` turns communication-bound: below the
    returned value the collective takes longer than the compute it hides behind (no overlap).

    R = P / W (the link's ridge), e = bytes per element, GPT layer (12 h^2 weights, FFN 4h):

    - dp   tokens per GPU per step   6 P T / F = 2 (n-1)/n P e / W       ->  T* = (e/3) (n-1)/n R
    - fsdp tokens per GPU per step   ZeRO-3 sends 3 (n-1)/n P e           ->  T* = (e/2) (n-1)/n R
    - tp   hidden size               72 h^2 T / t vs 4 all-reduces of T h e ->  h* = (e/9) (t-1) R
    - cp   sequence length (ring)    7 (s/c) s h vs 6 (c-1) (s/c) h_kv e  ->  s* = (6e/7) (c-1) (h_kv/h) R
    - ep   expert FFN size           6 (g+1) h f per token copy vs 4 (n-1)/n h e  ->  f* = 2e/(3(g+1)) (n-1)/n R
    (g = 2 with SwiGLU, else 1; ``kv_ratio`` = h_kv / h, 1 without GQA).
    """
    if axis not in AXES:
        raise ValueError(f"axis must be one of {AXES}, got {axis!r}")
    positive_int("n", n)
    R, e, share = ridge(peak_flops, bandwidth), bytes_per_element, (n - 1) / n
    gate = 2 if swiglu else 1
    return {"dp": e / 3 * share * R, "fsdp": e / 2 * share * R, "tp": e / 9 * (n - 1) * R,
            "cp": 6 * e / 7 * (n - 1) * kv_ratio * R,
            "ep": 2 * e / (3 * (gate + 1)) * share * R}[axis]


def layout_links(cluster, layout: dict) -> dict:
    """{axis: (bytes/s per rank, "NVLink" | "network")} for each axis of ``layout`` larger than 1.

    Megatron's rank order puts TP innermost, then CP, then DP (or FSDP); the EP group takes TP x EP
    consecutive ranks. A group of ``size`` ranks over ``span`` consecutive ranks gets
    ``Cluster.link(span, size)``: NVLink inside a node, else its share of the node's NICs."""
    tp, cp, ep = (layout.get(a, 1) for a in ("tp", "cp", "ep"))
    spans = {"tp": (tp, tp), "cp": (tp * cp, cp), "ep": (tp * ep, ep)}
    for axis in ("dp", "fsdp"):
        spans[axis] = (tp * cp * layout.get(axis, 1), layout.get(axis, 1))
    out = {}
    for axis, (span, size) in spans.items():
        if size > 1:
            inside = cluster.gpus_per_node % span == 0
            out[axis] = (cluster.link(span, size)[0], "NVLink" if inside else "network")
    return out
