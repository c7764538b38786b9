"""Measure weights that travel (issue 38): logits differences per family and layout, file sizes,
conversion times. Writes data/interop_measured.json, which the chapter "Weights that travel" reads.

    PYTHONPATH=$PWD python tests/bench_interop.py          (needs requirements-interop.txt; ~2 min)

float64, CPU. "lifted": Hugging Face's float32 islands (RMSNorm, RoPE angles, Mixtral's router
softmax) computed in float64 (tests/interop_hf.py); "as shipped": transformers as it runs.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from interop_hf import CLASSES, float64_islands, hf_logits, hf_model, transformers  # noqa: E402

import labkit  # noqa: E402
from labkit.interop.hf import export_hf, import_hf, load_state  # noqa: E402
from labkit.interop.labkit_ckpt import read_checkpoint  # noqa: E402
from labkit.interop.megatron_format import export_megatron, import_megatron  # noqa: E402
from labkit.model import GPT, preset  # noqa: E402
from test_interop_layouts import RUNS  # noqa: E402

TOKENS = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))


def diffs(model, hf) -> dict:
    with torch.no_grad():
        ours = model(TOKENS)
    plain = (ours - hf_logits(hf, TOKENS)).abs().max().item()
    with float64_islands():
        lifted = (ours - hf_logits(hf, TOKENS)).abs().max().item()
    return {"lifted": lifted, "as_shipped": plain}


def folder_bytes(path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def from_transformers(root) -> list[dict]:
    rows = []
    for fam in CLASSES:
        hf = hf_model(fam)
        hf.save_pretrained(root / fam)
        t0 = time.perf_counter()
        cfg, state = import_hf(root / fam)
        t_import = time.perf_counter() - t0
        model = GPT(cfg).double().eval()
        load_state(model, state)
        rows.append(dict(family=fam, source="transformers save_pretrained", **diffs(model, hf),
                         hf_bytes=folder_bytes(root / fam), import_s=round(t_import, 4)))
    return rows


def from_layouts(root) -> list[dict]:
    rows = []
    for name, (fam, model_args, world, layout) in RUNS.items():
        labkit.train(world_size=world, steps=1, log_interval=0, save=root / name, **model_args, **layout)
        t0 = time.perf_counter()
        _, cfg, state = read_checkpoint(root / name)
        export_hf(state, cfg, root / (name + " hf"))
        t_export = time.perf_counter() - t0
        export_megatron(state, cfg, root / (name + " megatron"))
        hf = getattr(transformers, CLASSES[fam]).from_pretrained(
            root / (name + " hf"), local_files_only=True, experts_implementation="eager").eval()
        model = GPT(cfg).double().eval()
        load_state(model, state)
        rows.append(dict(family=fam, source=f"labkit checkpoint saved under {name.split()[1].upper()}",
                         **diffs(model, hf), labkit_bytes=folder_bytes(root / name),
                         hf_bytes=folder_bytes(root / (name + " hf")),
                         megatron_bytes=folder_bytes(root / (name + " megatron")), export_s=round(t_export, 4)))
    return rows


def gpt2_124m(root) -> dict:
    """Conversion times of a GPT-2 124M-sized model (float32, 50304-token padded vocabulary)."""
    cfg = preset("gpt2")
    state = GPT(cfg).state_dict()
    out = {"parameters": sum(t.numel() for t in state.values())}
    for what, fn in [("export_hf_s", lambda: export_hf(state, cfg, root / "124m hf", max_shard_bytes=200 * 10**6)),
                     ("import_hf_s", lambda: import_hf(root / "124m hf")),
                     ("export_megatron_s", lambda: export_megatron(state, cfg, root / "124m megatron")),
                     ("import_megatron_s", lambda: import_megatron(root / "124m megatron"))]:
        t0 = time.perf_counter()
        fn()
        out[what] = round(time.perf_counter() - t0, 2)
    out["hf_files"] = sorted(p.name for p in (root / "124m hf").iterdir())
    out["hf_bytes"], out["megatron_bytes"] = folder_bytes(root / "124m hf"), folder_bytes(root / "124m megatron")
    return out


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="interop-bench-"))
    try:
        result = {"torch": torch.__version__, "transformers": transformers.__version__,
                  "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                  "tiny": from_transformers(root) + from_layouts(root), "gpt2_124m": gpt2_124m(root)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = Path(__file__).resolve().parent.parent / "data" / "interop_measured.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
