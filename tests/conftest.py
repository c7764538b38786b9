"""Shared pytest set-up: the nbval sanitizer, the gpu marker, and small helpers for rank tests."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def pytest_configure(config):
    # Every nbval run uses the project's sanitizer (values that truly vary: timings, addresses).
    if hasattr(config.option, "nbval_sanitize_with") and not config.option.nbval_sanitize_with:
        config.option.nbval_sanitize_with = str(SANITIZE)


def cuda_devices() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch, no GPU
        return 0


def pytest_collection_modifyitems(config, items):
    n = cuda_devices()
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        need = marker.kwargs.get("devices", 1)
        if n < need:
            item.add_marker(pytest.mark.skip(
                reason=f"needs {need} CUDA device(s), found {n}: NCCL path runs on a GPU node only"))
