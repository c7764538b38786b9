"""Shared pytest set-up: the gpu marker, and CPU ranks for every test not marked gpu.

* ``@pytest.mark.gpu(devices=n)``: skipped, with the reason, on a machine with fewer than ``n``
  CUDA devices (``python -m labkit gpu-check`` runs these on a GPU node and reports them).
* ``LABKIT_BACKEND=gloo`` (unless set already): ``launch(backend="auto")`` means CPU ranks in
  every test and in the notebooks nbval executes, on a GPU node too, so the unmarked tests check
  the same thing everywhere and stored outputs stay comparable. Tests that need NCCL ask for it
  (``backend="nccl"``) and are marked gpu; one that means to test "auto" itself takes the
  ``auto_backend`` fixture. ``LABKIT_BACKEND=auto pytest ...`` runs everything with the real
  default. (The nbval sanitizer is set in pyproject.toml.)
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("LABKIT_BACKEND", "gloo")


def cuda_devices() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch, no GPU
        return 0


@pytest.fixture
def auto_backend(monkeypatch):
    """``backend="auto"`` as outside the tests: decided afresh by the next launch, from the GPUs."""
    from labkit import launcher
    monkeypatch.setenv("LABKIT_BACKEND", "auto")
    monkeypatch.setattr(launcher, "_auto", None)


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
