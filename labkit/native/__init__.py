"""labkit's layouts through PyTorch's own parallel APIs, proven equal to labkit's and to one device
(chapter "From labkit to PyTorch-native").

    labkit.train(world_size=4, steps=5, zero_stage=3, implementation="native")
    labkit.train(world_size=4, steps=5, pipeline_model_parallel_size=2, num_layers=4,
                 untie_embeddings_and_output_weights=True, global_batch_size=8,
                 implementation=labkit.native.NativeOptions(schedule="ZBVZeroBubble"))

The same TrainConfig (Megatron's names) is cut by PyTorch's APIs on a ``DeviceMesh`` built from
labkit's Topology, in torchtitan's order:

    mesh.py      Topology -> DeviceMesh ("pp", "dp" | "dp_replicate", "dp_shard", "tp")
    pipeline.py  torch.distributed.pipelining: PipelineStage per GPT.part, five schedules
    tp_plan.py   parallelize_module plan found by role (GPT-2 and the Llama family), each cut
                 checked against labkit's shard plan: ColwiseParallel, RowwiseParallel,
                 SequenceParallel, loss_parallel
    fsdp.py      FSDP2 fully_shard per layer (reshard_after_forward, MixedPrecisionPolicy, HSDP)
    run.py       the rank's training loop; grads.py its norm and reassembled gradients
    count.py     CommDebugMode (calls) and a byte counter on the same step
    bytes.py     the bytes of a native step, predicted term by term (pure), and labkit.calc's
    options.py   NativeOptions and what the native path refuses, with the reason
    errors.py    what does not run on the CPU, reproduced
    timeline.py  the pipelining schedules' action lists, timed on labkit's clock
    figures.py   the chapter's figures; compare.py both implementations and the reference
"""
from .options import CP_ERROR, SCHEDULES, NativeOptions, check_native, resolve

__all__ = ["CP_ERROR", "SCHEDULES", "NativeOptions", "check_native", "resolve"]
