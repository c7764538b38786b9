"""Shared pytest set-up: the gpu marker. (The nbval sanitizer is set in pyproject.toml.)"""
from __future__ import annotations

import pytest


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
