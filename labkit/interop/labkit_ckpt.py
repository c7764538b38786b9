"""A labkit checkpoint (saved under any layout) <-> dense weights, and the run that trains them.

Chapter "Weights that travel". labkit's checkpoints (``labkit.checkpoint``) store every weight
under its dense name and global shape, in the pieces the ranks owned; reading them whole is DCP's
own "reassemble" (no process group, no model built), whatever TP/PP/DP/EP layout saved them.
Writing the other way makes an iteration-0 checkpoint that ``labkit.train(load=...)`` resumes
under any layout: weights only (no optimizer moments, the RNG streams reseeded), as Megatron's
``--finetune`` / ``--no-load-optim`` start from converted weights.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from ..checkpoint import files
from ..config import BYTE_VOCAB_SIZE, TrainConfig, padded_vocab_size, train_config
from ..spec import GPTConfig
from .hf_names import one_process


def read_checkpoint(load) -> tuple[TrainConfig, GPTConfig, dict]:
    """(the run's TrainConfig, the model spec, {dense name: tensor}) of the latest finished
    checkpoint under ``load`` (verified: manifest, sizes, hashes)."""
    path = files.find(load)
    if path is None:
        raise ValueError(f"{load}: no labkit checkpoint there")
    found = files.verify(path)
    cfg = train_config(**found.info["config"])
    model_cfg = cfg.model_config()              # the vocabulary as padded under the run's TP
    meta = files.read_metadata(found.path)
    state = {k: torch.empty(md.size, dtype=md.properties.dtype)
             for k, md in meta.state_dict_metadata.items() if k.startswith("model.") and hasattr(md, "size")}
    with one_process():
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(found.path)), no_dist=True)
    return cfg, model_cfg, {k.removeprefix("model."): v for k, v in state.items()}


def train_args(cfg: GPTConfig, tensor_model_parallel_size: int = 1) -> dict:
    """``labkit.train`` / ``TrainConfig`` keyword arguments of the model ``cfg`` (its vocabulary
    must be labkit's 256 bytes padded as Megatron pads under this TP), or ValueError why not."""
    tp = tensor_model_parallel_size
    why = []
    if cfg.vocab_size % tp or padded_vocab_size(BYTE_VOCAB_SIZE, cfg.vocab_size // tp, tp) != cfg.vocab_size:
        why.append(f"vocab_size {cfg.vocab_size}: labkit.train reads bytes ({BYTE_VOCAB_SIZE} tokens, padded to "
                   f"a multiple of make_vocab_size_divisible_by x tp {tp})")
    for name in ("layernorm_epsilon", "init_method_std"):
        if getattr(cfg, name) != GPTConfig.__dataclass_fields__[name].default:
            why.append(f"{name} {getattr(cfg, name)} (a TrainConfig builds the model with "
                       f"{GPTConfig.__dataclass_fields__[name].default})")
    if why:
        raise ValueError("labkit.train cannot train this model: " + "; ".join(why))
    out = {k: getattr(cfg, k) for k in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                                        "ffn_hidden_size", "hidden_dropout", "attention_dropout")}
    out.update(cfg.arch_args())
    out.update({k: v for k, v in cfg.moe_args().items() if k != "num_experts" or v is not None})
    return dict(out, make_vocab_size_divisible_by=cfg.vocab_size // tp)


def write_checkpoint(state: dict, cfg: TrainConfig, save, seed: int = 0) -> Path:
    """An iteration-0 labkit checkpoint of the dense ``state`` for the run ``cfg``: weights only.
    Returns its folder. ``labkit.train(load=save, ...)`` then resumes it under any layout."""
    want = {n: tuple(p.shape) for n, p in _shapes(cfg).items()}
    got = {n: tuple(t.shape) for n, t in state.items()}
    if want != got:
        bad = sorted(set(want) ^ set(got)) or sorted(n for n in want if want[n] != got[n])
        raise ValueError(f"the weights do not fit the run's model: {bad[:3]}")
    dtype = getattr(torch, cfg.params_dtype)
    out = {f"model.{n}": t.detach().to(dtype).contiguous() for n, t in state.items()}
    out["optimizer.step"] = None                      # AdamW starts afresh: no step, no moments
    final = files.iteration_dir(save, 0)
    final.mkdir(parents=True, exist_ok=False)
    with one_process():
        dcp.save(out, storage_writer=dcp.FileSystemWriter(str(final)), no_dist=True)
    info = {"format": files.FORMAT, "iteration": 0, "consumed_samples": 0, "seed": seed,
            "model": files.model_fields(cfg), "layout": {"converted": "dense weights"},
            "config": asdict(cfg), "optimizer_states": [], "torch": torch.__version__}
    files.write_atomic(final / files.INFO, json.dumps(info, indent=1, sort_keys=True, default=str))
    files.write_manifest(final)
    files.write_atomic(Path(save) / files.TRACKER, "0")
    return final


def _shapes(cfg: TrainConfig) -> dict:
    """{dense name: parameter} of the run's model, built on the meta device (no memory, no init)."""
    from ..model import GPT
    with torch.device("meta"):
        return dict(GPT(cfg.model_config()).named_parameters())
