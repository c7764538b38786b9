"""Read and write dense tensors in pieces through ``torch.distributed.checkpoint`` (DCP).

Chapter "When training goes wrong". A rank's state dict maps each checkpoint key (a dense name,
``model.decoder.layers.0.mlp.linear_fc1.weight``) to :class:`Chunks`: the tensor's global shape
and the pieces this rank writes (or wants), each at its global offsets. Two small planners (DCP's
documented extension point, ``SavePlanner`` / ``LoadPlanner``) turn them into DCP's write and read
items, so the files are DCP's own format (``.metadata`` + ``__R_I.distcp``) that other tools read
(``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` gives a plain state dict):

    save: every rank lists its pieces; the coordinator checks that they tile each tensor exactly
          (no overlap, nothing missing: DCP's global plan validation) and writes the metadata
    load: each rank asks for the global boxes its NEW layout needs; DCP reads the parts of the
          saved pieces that overlap them: "reassemble, then cut by the new plan" without ever
          building a dense tensor

Other values (RNG states, the optimizer's step) are pickled byte items under their own key.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex,
                                                   TensorProperties, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import (_create_write_item_for_bytesio,
                                                          create_read_items_for_chunk_list)


@dataclass
class Chunks:
    """One checkpoint tensor as this rank sees it: its global ``shape`` and ``pieces``
    [(global offsets, tensor of the piece's shape)] (to write, or to be filled by a load)."""

    shape: tuple
    pieces: list = field(default_factory=list)

    def add(self, offsets, tensor) -> None:
        self.pieces.append((tuple(int(o) for o in offsets), tensor))

    def staged(self) -> "Chunks":
        """A copy whose pieces are contiguous tensors on the CPU (what a background write reads
        while training changes the originals)."""
        return Chunks(self.shape, [(o, t.detach().to("cpu", copy=True).contiguous()) for o, t in self.pieces])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.pieces)


def _chunk_md(offsets, tensor) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(tensor.shape))


class PiecesSavePlanner(DefaultSavePlanner):
    """DCP's default save planner, with :class:`Chunks` values written piece by piece (one SHARD
    write item per piece) and every other value as a pickled byte item."""

    def __init__(self):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def create_local_plan(self) -> SavePlan:
        items = []
        for fqn, obj in self.state_dict.items():
            if isinstance(obj, Chunks):
                for offsets, t in obj.pieces:
                    items.append(WriteItem(
                        index=MetadataIndex(fqn, torch.Size(offsets)), type=WriteItemType.SHARD,
                        tensor_data=TensorWriteData(chunk=_chunk_md(offsets, t),
                                                    properties=TensorProperties.create_from_tensor(t),
                                                    size=torch.Size(obj.shape))))
            else:
                items.append(_create_write_item_for_bytesio(fqn, obj))
        self.plan = SavePlan(items)
        return self.plan

    def lookup_object(self, index: MetadataIndex):
        obj = self.state_dict[index.fqn]
        if not isinstance(obj, Chunks):
            return obj
        for offsets, t in obj.pieces:
            if torch.Size(offsets) == index.offset:
                return t
        raise ValueError(f"checkpoint key {index.fqn}: no piece at offsets {tuple(index.offset)}")


class PiecesLoadPlanner(DefaultLoadPlanner):
    """Fill :class:`Chunks` destinations (tensors on this rank: views of the parameters, of the
    optimizer's shard, of its moments) from whatever pieces were saved; byte items land in
    ``self.objects``. ``where`` names the checkpoint in errors (a missing key, another shape)."""

    def __init__(self, where: str = "the checkpoint"):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.where, self.objects = where, {}

    def set_up_planner(self, state_dict, metadata=None, is_coordinator: bool = False) -> None:
        self.state_dict, self.original_state_dict = state_dict, state_dict   # as given: no copies
        self.metadata, self.is_coordinator = metadata, is_coordinator

    def create_local_plan(self):
        from torch.distributed.checkpoint.planner import LoadPlan
        saved, items = self.metadata.state_dict_metadata, []
        for fqn, obj in self.state_dict.items():
            md = saved.get(fqn)
            if md is None:
                raise ValueError(f"{self.where}: no entry {fqn!r} (the checkpoint holds {len(saved)} "
                                 f"entries; was it saved from another model or optimizer?)")
            if isinstance(obj, Chunks):
                if not isinstance(md, TensorStorageMetadata) or tuple(md.size) != tuple(obj.shape):
                    got = tuple(md.size) if isinstance(md, TensorStorageMetadata) else "bytes"
                    raise ValueError(f"{self.where}: {fqn} has shape {got} in the checkpoint, this model "
                                     f"needs {tuple(obj.shape)}: incompatible checkpoint")
                items += create_read_items_for_chunk_list(
                    fqn, md, [_chunk_md(o, t) for o, t in obj.pieces])
            else:
                items += self._bytes_item(fqn)
        return LoadPlan(items)

    def _bytes_item(self, fqn):
        from torch.distributed.checkpoint.planner_helpers import _create_read_item_for_byteio
        return [_create_read_item_for_byteio(dest_index=MetadataIndex(fqn), dest_offset=0,
                                             storage_index=MetadataIndex(fqn), storage_offset=0, length=0)]

    def lookup_tensor(self, index: MetadataIndex):
        return self.state_dict[index.fqn].pieces[index.index][1]

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        self.objects[read_item.dest_index.fqn] = torch.load(value, weights_only=False)
