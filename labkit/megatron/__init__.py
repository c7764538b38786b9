"""labkit's layouts through Megatron-Core itself (``megatron-core`` 0.16.1, its own GPTModel,
parallel_state, schedules, DDP and optimizer), judged by the same one-device oracle
(chapter "One layout, three implementations").

    labkit.train(world_size=2, steps=5, tensor_model_parallel_size=2, sequence_parallel=True,
                 implementation="megatron")

    options.py       what runs and what is refused (named rules, pure Python)
    cpu_standins.py  the CPU stand-ins, each naming its Megatron site (none active on CUDA)
    build.py         TrainConfig -> parallel_state, TransformerConfig, GPTModel chunks, DDP, optimizer
    weights.py       labkit's dense weights -> Megatron's cuts, gradients back under dense names
    run.py           the rank's training loop (get_forward_backward_func, finalize_model_grads)
    count.py         bytes per collective, as labkit counts its own
Needs ``pip install -r requirements-megatron.txt``; nothing here imports megatron at import time.
"""
from .options import MEGATRON_CORE_VERSION, RULES, check_megatron, installed, refusals

__all__ = ["MEGATRON_CORE_VERSION", "RULES", "check_megatron", "installed", "refusals"]
