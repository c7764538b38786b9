"""GPUs and clusters: peak FLOP/s, memory, link bandwidths (chapters "Collectives", "Planning a run").

Peak dense 16-bit tensor-core FLOP/s from NVIDIA's datasheets (V100 SXM2 125 TFLOP/s, A100 312,
H100 SXM 989, H200 989, B200 2,250). Bandwidths are bytes/s
per direction: ``intra_node_bandwidth`` per GPU (NVLink), ``inter_node_bandwidth`` per NODE (all
its NICs together, shared by its GPUs). Jean Zay's V100 nodes: 4x V100-32GB, 50 GB/s intra-node
and 400 Gb/s inter-node. The Narayanan et al. 2021 cluster (Selene) is DGX A100: NVSwitch, 300 GB/s
per direction per GPU, and eight 200 Gb/s HDR InfiniBand HCAs per node, 1600 Gb/s.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..validate import positive_int

GIB = 1024 ** 3


@dataclass(frozen=True)
class GPU:
    """A GPU. ``peak_fp8_flops`` 0 = no FP8 tensor cores; ``sms`` sets the wave size of GEMM tiles."""

    name: str
    peak_flops: float          # dense 16-bit tensor-core FLOP/s
    memory_bytes: float
    hbm_bandwidth: float = 2.0e12   # bytes/s
    peak_fp8_flops: float = 0.0     # dense FP8 tensor-core FLOP/s
    sms: int = 108                  # streaming multiprocessors
    generation: str = ""            # "V100" | "A100" | "H100" | "B200": GEMM efficiency, attention curve


@dataclass(frozen=True)
class Cluster:
    """``nodes`` nodes of ``gpus_per_node`` GPUs; alpha-beta link parameters."""

    gpu: GPU
    gpus_per_node: int
    nodes: int = 1
    intra_node_bandwidth: float = 300e9      # bytes/s per GPU per direction
    inter_node_bandwidth: float = 200e9      # bytes/s per node per direction
    intra_node_latency: float = 5e-6
    inter_node_latency: float = 10e-6
    name: str = ""

    def __post_init__(self):
        for f in ("gpus_per_node", "nodes"):
            positive_int(f, getattr(self, f))

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def with_(self, **changes) -> "Cluster":
        return replace(self, **changes)

    def link(self, group_span: int, group_size: int | None = None):
        """(bandwidth per rank, latency) of a group of ``group_size`` ranks spread evenly over
        ``group_span`` consecutive ranks (Megatron's rank order puts TP innermost, then CP, DP, PP).

        A group inside one node uses NVLink: its span divides the node size, so groups do not
        straddle nodes. A group that leaves the node uses the NICs: a ring (NCCL runs one ring per
        NIC) enters and leaves each node once, so a group with k members per node moves its data
        through the node at k / gpus_per_node of the node's NIC bandwidth; the other groups of the
        node, which communicate at the same time, take the rest. One member per node (TP 8 + DP)
        gets 1/8 of the node's NICs; a group holding the whole node (FSDP, TP 1) gets all of them.
        """
        if self.gpus_per_node % group_span == 0:
            return self.intra_node_bandwidth, self.intra_node_latency
        stride = max(1, group_span // (group_size or group_span))      # ranks between members
        per_node = max(1, self.gpus_per_node // stride)                # members of the group per node
        return (min(self.inter_node_bandwidth * per_node / self.gpus_per_node, self.intra_node_bandwidth),
                self.inter_node_latency)

    def group_nodes(self, group_span: int, group_size: int | None = None) -> int:
        """How many nodes a group of ``group_size`` ranks spread over ``group_span`` ranks touches."""
        size = group_size or group_span
        if self.gpus_per_node % group_span == 0:
            return 1
        stride = max(1, group_span // size)
        return -(-size // max(1, self.gpus_per_node // stride))


# NVIDIA datasheets: V100 SXM2 (900 GB/s HBM2, 80 SMs), A100 80GB SXM (2,039 GB/s, 108 SMs; 40GB: 1,555 GB/s),
# H100 SXM (3.35 TB/s HBM3, 132 SMs, 1,979 dense FP8 TFLOP/s), H200 (4.8 TB/s HBM3e).
# H100-96GB-500W: Meta's Grand Teton H100 (96 GB HBM2e, 2.4 TB/s, run at 500 W; torchtitan
#   benchmarks/llama3_h100_202412_torchtitan.md): its peak is "between SXM and NVL" (989 and 835 dense
#   TFLOP/s) and not known; labkit takes the midpoint, 912 (FP8 twice that). An assumption.
# B200 (DGX B200, 1,000 W): 2.25 PFLOP/s dense BF16, 4.5 FP8 (NVIDIA Blackwell architecture technical
#   brief, as quoted in pytorch/ao torchao/testing/training/roofline_utils.py), 180 GB HBM3e at 8 TB/s,
#   148 SMs (pytorch/ao PR 4002 reads 7.68 TB/s from the driver; the datasheet's 8 is used).
GPUS = {
    "V100-32GB": GPU("V100-32GB", 125e12, 32 * GIB, 900e9, 0.0, 80, "V100"),
    "A100-80GB": GPU("A100-80GB", 312e12, 80 * GIB, 2.039e12, 0.0, 108, "A100"),
    "A100-40GB": GPU("A100-40GB", 312e12, 40 * GIB, 1.555e12, 0.0, 108, "A100"),
    "H100-80GB": GPU("H100-80GB", 989e12, 80 * GIB, 3.35e12, 1979e12, 132, "H100"),
    "H200-141GB": GPU("H200-141GB", 989e12, 141e9, 4.8e12, 1979e12, 132, "H100"),
    "H100-96GB-500W": GPU("H100-96GB-500W", 912e12, 96e9, 2.4e12, 1824e12, 132, "H100"),
    "B200-180GB": GPU("B200-180GB", 2250e12, 180e9, 8.0e12, 4500e12, 148, "B200"),
}

CLUSTERS = {
    # Narayanan et al. 2021 (Selene, DGX A100): NVSwitch + 8 x 200 Gb/s HDR per node
    "dgx-a100": Cluster(GPUS["A100-80GB"], 8, 1, 300e9, 8 * 200e9 / 8, name="dgx-a100"),
    # a DGX A100 with half its NICs: 300 GB/s intra, 800 Gb/s inter
    "notes-dgx": Cluster(GPUS["A100-80GB"], 8, 1, 300e9, 800e9 / 8, name="notes-dgx"),
    # Jean Zay (IDRIS) V100 partition: 4 x V100-32GB per node, 50 GB/s intra, 400 Gb/s inter
    "jean-zay-v100": Cluster(GPUS["V100-32GB"], 4, 1, 50e9, 400e9 / 8, name="jean-zay-v100"),
    # the same V100 nodes as NCCL measured them: all-reduce bus bandwidth ~85 Gb/s between 4 nodes
    # (bigscience-workshop/bigscience experiments/bandwidth/all_reduce_bench-32gb-n4.txt, Jan 2022;
    # its README: NCCL "doesn't fully utilize Intel OPA full bandwidth", 400 Gb/s)
    "jean-zay-v100-nccl": Cluster(GPUS["V100-32GB"], 4, 1, 50e9, 85e9 / 8, name="jean-zay-v100-nccl"),
    # Jean Zay A100 partition (BLOOM-176B): 8 x A100-80GB, 4 Omni-Path links per node (jz/hpc-specs.md),
    # 4 x 100 Gb/s; NVLink taken as an SXM4 board's 300 GB/s per direction
    "jean-zay-a100": Cluster(GPUS["A100-80GB"], 8, 1, 300e9, 400e9 / 8, name="jean-zay-a100"),
    # DGX H100 / H200: NVLink 4 (450 GB/s per direction), 8 x 400 Gb/s per node
    "dgx-h100": Cluster(GPUS["H100-80GB"], 8, 1, 450e9, 8 * 400e9 / 8, name="dgx-h100"),
    "dgx-h200": Cluster(GPUS["H200-141GB"], 8, 1, 450e9, 8 * 400e9 / 8, name="dgx-h200"),
    # Grand Teton (Meta): 8 H100 with NVLink 4, 400 Gb/s RDMA per GPU (torchtitan benchmarks page)
    "grand-teton-h100": Cluster(GPUS["H100-96GB-500W"], 8, 1, 450e9, 8 * 400e9 / 8, name="grand-teton-h100"),
    # DGX B200: NVLink 5, 18 links = 1.8 TB/s per GPU (900 GB/s per direction), 8 x 400 Gb/s ConnectX-7
    # (MLCommons inference v6.0 system description nebius_b200_n1.json)
    "dgx-b200": Cluster(GPUS["B200-180GB"], 8, 1, 900e9, 8 * 400e9 / 8, name="dgx-b200"),
}


# NCCL's own latency model for the ring algorithm with the Simple protocol (large messages), from
# NVIDIA/nccl src/graph/tuning.cc (commit 5067397c): base 8.4 us, then 3.4 us per ring step over
# NVLink (at least the network overhead, 1 us x 3 for Simple on an x86 host) and 14 us per step that
# crosses nodes.
NCCL_BASE_US, NCCL_NVLINK_STEP_US, NCCL_NET_STEP_US = 8.4, 3.4, 14.0


def nccl_ring_latency(op: str, n_ranks: int, n_nodes: int = 1) -> float:
    """Seconds of latency NCCL's tuner charges a ring ``op`` over ``n_ranks`` on ``n_nodes``:
    base + (steps - steps across nodes) x 3.4 us + (steps across nodes) x 14 us, with
    2(n-1) steps for all-reduce and n-1 for all-gather / reduce-scatter (2(nodes-1) and nodes-1 of
    them across nodes); n steps for anything else (all-to-all, send/recv)."""
    if n_ranks <= 1:
        return 0.0
    steps = {"all_reduce": 2 * (n_ranks - 1), "all_gather": n_ranks - 1, "reduce_scatter": n_ranks - 1}.get(op, n_ranks)
    inter = 0 if n_nodes <= 1 else (2 * (n_nodes - 1) if op == "all_reduce" else n_nodes - 1)
    intra = NCCL_NVLINK_STEP_US if n_nodes <= 1 else max(NCCL_NVLINK_STEP_US, 3 * 1.0)
    return 1e-6 * (NCCL_BASE_US + (steps - inter) * intra + inter * NCCL_NET_STEP_US)


def cluster(name: str, nodes: int = 1) -> Cluster:
    """A preset cluster with ``nodes`` nodes."""
    if name not in CLUSTERS:
        raise ValueError(f"unknown cluster {name!r}; choose one of {sorted(CLUSTERS)}")
    return CLUSTERS[name].with_(nodes=nodes)
