"""labkit's Topology as a PyTorch ``DeviceMesh`` (chapter "From labkit to PyTorch-native").

A DeviceMesh is the rank grid as an n-d tensor of ranks with named dimensions; slicing it by name
(``mesh["tp"]``) gives the 1-d mesh, and so the process group, of this rank on that axis: what
labkit's ``build_groups(topo)["tp"]`` is. Megatron's order ``tp-cp-dp-pp`` (tp fastest) is the
mesh's shape read from the last dimension: ``rank = tp_rank + tp * (dp_rank + dp * pp_rank)`` is
``arange(world).reshape(pp, dp, tp)``, torchtitan's ``["pp", "dp", "tp"]`` (its
``ParallelDims.build_mesh``). HSDP splits dp into ``dp_replicate x dp_shard`` (shard fastest), so
``dp_rank = replicate_rank * dp_shard + shard_rank``, the same samples per rank as plain DP.
"""
from __future__ import annotations

from ..topology import Topology


def mesh_shape(topo: Topology, dp_replicate: int = 1) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(shape, dimension names) of the mesh for ``topo``, slowest dimension first. Pure."""
    if topo.cp != 1:
        raise ValueError(f"context_parallel_size {topo.cp}: the native path has no cp mesh dimension "
                         f"(see labkit.native.options.CP_ERROR)")
    if topo.dp % dp_replicate:
        raise ValueError(f"dp_replicate {dp_replicate} must divide the data-parallel size {topo.dp}")
    if dp_replicate > 1:
        return ((topo.pp, dp_replicate, topo.dp // dp_replicate, topo.tp),
                ("pp", "dp_replicate", "dp_shard", "tp"))
    return (topo.pp, topo.dp, topo.tp), ("pp", "dp", "tp")


def mesh_ranks(topo: Topology, dp_replicate: int = 1):
    """The mesh as nested lists of global ranks (what ``DeviceMesh.mesh.tolist()`` holds). Pure."""
    shape, _ = mesh_shape(topo, dp_replicate)
    flat = list(range(topo.world_size))
    for n in reversed(shape[1:]):                   # fold from the fastest dimension outwards
        flat = [flat[i:i + n] for i in range(0, len(flat), n)]
    return flat


def build_mesh(topo: Topology, dp_replicate: int = 1, device_type: str = "cpu"):
    """The DeviceMesh of ``topo`` on every rank (a collective: every rank calls it)."""
    from torch.distributed.device_mesh import init_device_mesh
    shape, names = mesh_shape(topo, dp_replicate)
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


def dp_mesh(mesh):
    """The data-parallel part of ``mesh``: 1-d ``dp`` (FSDP), or 2-d ``(dp_replicate, dp_shard)``
    (HSDP: FSDP2 shards over the second, replicates over the first)."""
    names = mesh.mesh_dim_names
    return mesh["dp_replicate", "dp_shard"] if "dp_shard" in names else mesh["dp"]


def axis_groups(mesh) -> dict:
    """{axis: ProcessGroup} of this rank, one per mesh dimension (for ``count.ByteCounter``)."""
    return {name: mesh.get_group(name) for name in mesh.mesh_dim_names}
