"""What PyTorch's APIs cannot do on the CPU with the pinned torch, reproduced (issue 26).

The chapter and the native path's refusals quote these errors (``labkit.native.options``); this
test runs the failing calls on one gloo rank and fails if the text changes, e.g. when a new torch
registers a CPU sharding strategy for flash attention, so the quotes cannot go stale.
"""
from __future__ import annotations

from labkit.launcher import launch
from labkit.native.errors import reproduce
from labkit.native.options import COMMDEBUG_PP_ERROR, CP_ERROR


def test_context_parallel_and_comm_debug_mode_errors_are_the_ones_quoted():
    errors = launch(reproduce, 1, timeout=120)[0]
    assert errors["context_parallel"] == CP_ERROR
    assert errors["CommDebugMode + pipelining"] == COMMDEBUG_PP_ERROR
