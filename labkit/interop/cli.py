"""``python -m labkit export|import``: a labkit checkpoint <-> a Hugging Face or Megatron-Core folder.

    python -m labkit export --load CKPT --hf OUT [--max-shard-size 5GB]     labkit -> Hugging Face
    python -m labkit export --load CKPT --megatron OUT                     labkit -> Megatron torch_dist
    python -m labkit import --hf FOLDER --save CKPT [--tensor-model-parallel-size T] [--params-dtype D]

``--load`` takes any labkit checkpoint (whatever layout saved it); ``import`` writes an iteration-0
checkpoint that ``python -m labkit train --load CKPT`` resumes under any layout. Each prints what it
wrote (files, bytes) and how long it took.
"""
from __future__ import annotations

import argparse
import time

UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "B": 1}


def parse_size(text: str) -> int:
    """"5GB" -> 5e9 bytes (Hugging Face's ``max_shard_size`` spelling); a plain number is bytes."""
    t = text.strip().upper()
    for unit in sorted(UNITS, key=len, reverse=True):
        if t.endswith(unit) and t[:-len(unit)].strip():
            return int(float(t[:-len(unit)]) * UNITS[unit])
    return int(t)


def export_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit export", description=__doc__.splitlines()[0])
    ap.add_argument("--load", required=True, help="a labkit checkpoint folder (any layout)")
    out = ap.add_mutually_exclusive_group(required=True)
    out.add_argument("--hf", help="write a Hugging Face model folder here")
    out.add_argument("--megatron", help="write Megatron-Core's torch_dist checkpoint here")
    ap.add_argument("--max-shard-size", default="5GB", help="Hugging Face shards of at most this size")
    args = ap.parse_args(argv)
    from .labkit_ckpt import read_checkpoint
    t0 = time.perf_counter()
    _, model_cfg, state = read_checkpoint(args.load)
    if args.hf:
        from .hf import export_hf
        wrote = export_hf(state, model_cfg, args.hf, max_shard_bytes=parse_size(args.max_shard_size))
        where = args.hf
    else:
        from .megatron_format import export_megatron
        wrote = export_megatron(state, model_cfg, args.megatron)
        where = args.megatron
    _report(wrote["files"], where, time.perf_counter() - t0)
    return 0


def import_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit import", description=__doc__.splitlines()[0])
    ap.add_argument("--hf", required=True, help="a Hugging Face model folder (GPT-2, Llama or Mixtral)")
    ap.add_argument("--save", required=True, help="write a labkit checkpoint (iteration 0) here")
    ap.add_argument("--tensor-model-parallel-size", type=int, default=1,
                    help="the TP the vocabulary padding is stated for (any layout loads it)")
    ap.add_argument("--params-dtype", default="float32", choices=["float32", "float64"])
    args = ap.parse_args(argv)
    from ..config import train_config
    from .hf import import_hf
    from .labkit_ckpt import train_args, write_checkpoint
    t0 = time.perf_counter()
    model_cfg, state = import_hf(args.hf)
    cfg = train_config(**train_args(model_cfg, args.tensor_model_parallel_size), params_dtype=args.params_dtype,
                       tensor_model_parallel_size=args.tensor_model_parallel_size)
    folder = write_checkpoint(state, cfg, args.save)
    _report({p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}, str(folder),
            time.perf_counter() - t0)
    return 0


def _report(files: dict, where: str, seconds: float) -> None:
    for name, size in files.items():
        print(f"  {name:40s} {size:>14,d} bytes")
    print(f"wrote {len(files)} files, {sum(files.values()):,d} bytes, to {where} in {seconds:.2f} s")
