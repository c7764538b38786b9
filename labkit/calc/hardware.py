"""GPUs and clusters: peak FLOP/s, memory, link bandwidths (chapters "Collectives", "Planning a run").

Peak dense 16-bit tensor-core FLOP/s from NVIDIA's datasheets (V100 SXM2 125 TFLOP/s, A100 312,
H100 SXM 989, H200 989). Bandwidths are bytes/s
per direction: ``intra_node_bandwidth`` per GPU (NVLink), ``inter_node_bandwidth`` per NODE (all
its NICs together, shared by its GPUs). Jean Zay's V100 nodes: 4x V100-32GB, 50 GB/s intra-node
and 400 Gb/s inter-node. The Narayanan et al. 2021 cluster (Selene) is DGX A100: NVSwitch, 300 GB/s
per direction per GPU, and eight 200 Gb/s HDR InfiniBand HCAs per node, 1600 Gb/s.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

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
    generation: str = ""            # "V100" | "A100" | "H100": selects the fitted GEMM efficiency


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
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f} must be a positive integer, got {v!r}")

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


# NVIDIA datasheets: V100 SXM2 (900 GB/s HBM2, 80 SMs), A100 80GB SXM (2,039 GB/s, 108 SMs; 40GB: 1,555 GB/s),
# H100 SXM (3.35 TB/s HBM3, 132 SMs, 1,979 dense FP8 TFLOP/s), H200 (4.8 TB/s HBM3e).
GPUS = {
    "V100-32GB": GPU("V100-32GB", 125e12, 32 * GIB, 900e9, 0.0, 80, "V100"),
    "A100-80GB": GPU("A100-80GB", 312e12, 80 * GIB, 2.039e12, 0.0, 108, "A100"),
    "A100-40GB": GPU("A100-40GB", 312e12, 40 * GIB, 1.555e12, 0.0, 108, "A100"),
    "H100-80GB": GPU("H100-80GB", 989e12, 80 * GIB, 3.35e12, 1979e12, 132, "H100"),
    "H200-141GB": GPU("H200-141GB", 989e12, 141e9, 4.8e12, 1979e12, 132, "H100"),
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
}


def cluster(name: str, nodes: int = 1) -> Cluster:
    """A preset cluster with ``nodes`` nodes."""
    if name not in CLUSTERS:
        raise ValueError(f"unknown cluster {name!r}; choose one of {sorted(CLUSTERS)}")
    return CLUSTERS[name].with_(nodes=nodes)
