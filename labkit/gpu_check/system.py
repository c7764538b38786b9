"""What machine the report describes: versions, GPUs, their topology, and their peak FLOP/s."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

from ..calc import GPUS

# Dense 16-bit tensor-core peak by device name (NVIDIA datasheets, via labkit.calc.GPUS). A name
# that matches none (H100 PCIe: 756 TFLOP/s, H100/H200 NVL: 835, V100: no bf16) gets no MFU
# unless --peak-tflops is given: a wrong peak would make a wrong MFU.
_PEAKS = ((("H100", "HBM3"), "H100-80GB"), (("H100", "SXM"), "H100-80GB"),
          (("H200",), "H200-141GB"), (("A100",), "A100-80GB"))


def peak_flops(gpu_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of the GPU called ``gpu_name`` (torch.cuda.get_device_name), or None."""
    if "NVL" in gpu_name or ("PCIe" in gpu_name and "A100" not in gpu_name):
        return None   # other clocks and peaks than the SXM parts of the same name
    for words, key in _PEAKS:
        if all(w in gpu_name for w in words):
            return GPUS[key].peak_flops
    return None


def _run(cmd) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def topology() -> str | None:
    """``nvidia-smi topo -m``: which GPU pairs talk over NVLink (NV#), PCIe (PIX/PXB/PHB) or CPU."""
    return _run(["nvidia-smi", "topo", "-m"])


def _git_commit() -> str | None:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return _run(["git", "-C", here, "rev-parse", "HEAD"])


def system_info() -> dict:
    """Versions and GPUs of this machine (calls CUDA: run it on the GPU node)."""
    import torch
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - a torch built without NCCL
        nccl = None
    gpus = []
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        p = torch.cuda.get_device_properties(i)
        gpus.append({"index": i, "name": p.name, "memory_bytes": p.total_memory,
                     "capability": f"{p.major}.{p.minor}", "peak_flops": peak_flops(p.name)})
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return {"python": sys.version.split()[0], "platform": platform.platform(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
            "cudnn": torch.backends.cudnn.version(), "driver": driver.splitlines()[0] if driver else None,
            "labkit_commit": _git_commit(), "gpus": gpus,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
