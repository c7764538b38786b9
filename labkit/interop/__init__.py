"""Weights that travel: labkit's dense weights as Hugging Face folders and Megatron-Core
checkpoints, and back (chapter "Weights that travel"; ``python -m labkit export|import``).

    hf_names.py         labkit (= Megatron-Core) names and layouts <-> GPT-2 / Llama / Mixtral's
    hf_config.py        the model spec <-> config.json, refusing what labkit does not compute
    hf.py               the folder: config.json + model.safetensors (sharded, with an index, when large)
    labkit_ckpt.py      a labkit checkpoint (any layout) <-> dense weights
    megatron_format.py  Megatron-Core's torch_dist checkpoint layout (keys, shapes, common.pt, metadata)
"""
