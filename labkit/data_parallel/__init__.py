"""Data parallelism and ZeRO (chapter "Data parallelism").

    member.py        DataParallelMember: the interface every DP class offers (Engine, checkpoints)
    ddp.py           naive and bucketed DDP (all-reduce), gradient accumulation
    shard_layout.py  one flat buffer cut into dp shards (pure layout arithmetic)
    zero.py          ZeRO-1 (Megatron's distributed optimizer), ZeRO-2, ZeRO-3 (FSDP)
    fsdp.py          ZeRO-2 and ZeRO-3 by units (one per layer), prefetched, as labkit.train runs them
    units.py         a unit: a layer's parameters in one flat buffer sharded over dp; a model cut into units
    fp8_gather.py    ZeRO-3 gathering the FP8 linears' weights as FP8 bytes (--fp8-param-gather)
    wrap.py          wrap_data_parallel: the parameters a rank holds, bucketed by the group that
                     averages them, under one interface for the Engine
"""
