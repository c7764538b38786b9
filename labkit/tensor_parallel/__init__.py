"""Tensor and sequence parallelism (chapters "Tensor parallelism" and "Sequence parallelism").

    tp_comm.py           the conjugate operators f / f-bar and g / g-bar (Megatron's mappings.py)
    layers.py            ColumnParallelLinear, RowParallelLinear
    vocab_parallel.py    the vocabulary-parallel embedding and cross-entropy
    sequence_parallel.py what SP adds: the embedding's scatter, the tags, the regather variant
    random.py            Megatron's dropout streams (replicated vs per-tp-rank)
    plan.py              the plan (module name -> style) and apply_tensor_parallel
"""
