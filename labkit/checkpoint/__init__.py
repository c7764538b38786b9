"""Distributed checkpoints: save from any layout, resume exactly, reshard into any other.

Chapter "When training goes wrong". ``labkit.train(save=DIR, save_interval=N, load=DIR,
async_save=True)`` (Megatron-LM's flags; ``python -m labkit train --save DIR --save-interval N
--load DIR --async-save``). The files are ``torch.distributed.checkpoint``'s format; every tensor
is stored under its dense name and global shape, in the pieces the ranks owned (the shard plan's
blocks and, under the distributed optimizer, the data-parallel shards). Loading is "reassemble,
then cut by the new plan", done by DCP box by box without building a dense tensor.

    boxes.py     a rank's element runs -> boxes of global offsets (pure)
    dcp_io.py    the DCP planners that write and read those boxes
    holdings.py  what a rank holds: weights, every optimizer state, RNG streams
    files.py     the folder, tracker, manifest; refusing an unfinished, corrupt or foreign checkpoint
    saver.py     Saver (sync or in the background) and load_into
"""
from .files import find, verify  # noqa: F401 - pure (json, hashlib)

__all__ = ["find", "verify", "Saver", "load_into"]


def __getattr__(name):  # torch-dependent parts on first use
    if name in ("Saver", "load_into", "layout_of"):
        from . import saver
        return getattr(saver, name)
    raise AttributeError(f"module 'labkit.checkpoint' has no attribute {name!r}")
