"""Shared pytest set-up: the gpu marker, and CPU ranks for every test not marked gpu.

* ``@pytest.mark.gpu(devices=n)``: skipped, with the reason, on a machine with fewer than ``n``
  CUDA devices (``python -m labkit gpu-check`` runs these on a GPU node and reports them).
* ``LABKIT_BACKEND=gloo`` (unless set already): ``launch(backend="auto")`` means CPU ranks in
  every test and in the notebooks nbval executes, on a GPU node too, so the unmarked tests check
  the same thing everywhere and stored outputs stay comparable. Tests that need NCCL ask for it
  (``backend="nccl"``) and are marked gpu; one that means to test "auto" itself takes the
  ``auto_backend`` fixture. ``LABKIT_BACKEND=auto pytest ...`` runs everything with the real
  default. (The nbval sanitizer is set in pyproject.toml.)
* ``pytest -m quick``: the newcomer's path (README, beside command 2), the tests :data:`QUICK`
  names: the units (no processes), the book's build checks, and one parity with one device per
  axis. A name that matches no collected test is an error, so the list cannot rot silently.
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


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One torch thread in the test process, as in every rank (``launch_rank``). The references
    and dense models the tests compute here are tiny: with torch's default of one thread per core,
    on a 2-core machine that the ranks and the other xdist worker keep busy, each small op waits
    for a spinning partner thread; measured on 2026-11-28 (load 20): a [128, 32] x [32, 96] linear
    33 ms instead of 0.19 ms, the Llama reference of tests/test_llama.py 13.1 s instead of 0.32 s."""
    try:
        import torch
    except ImportError:                     # the torch-free checks
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def auto_backend(monkeypatch):
    """``backend="auto"`` as outside the tests: decided afresh by the next launch, from the GPUs."""
    from labkit import launcher
    monkeypatch.setenv("LABKIT_BACKEND", "auto")
    monkeypatch.setattr(launcher, "_auto", None)


# pytest -m quick: whole files (units and the book's build checks), then one parity per axis
QUICK = (
    # units: no processes (topology, schedules, p2p plans, shard plans, roles, calculators, rules)
    "tests/test_topology.py", "tests/test_schedules.py", "tests/test_p2p_plan.py::test_every_schedule",
    "tests/test_shard_plan.py", "tests/test_roles.py", "tests/test_model.py", "tests/test_moe.py",
    "tests/test_moe_pattern.py", "tests/test_expert_parallel_layout.py", "tests/test_context_parallel_math.py",
    "tests/test_native_rules.py", "tests/test_layers.py", "tests/test_calc_core.py",
    "tests/test_calc_attention.py", "tests/test_calc_refusals.py", "tests/test_calc_megatron.py",
    "tests/test_calc_perf.py", "tests/test_calc_notorch.py", "tests/test_rule_book.py", "tests/test_goodput.py",
    "tests/test_data.py", "tests/test_debug_checks.py", "tests/test_drift.py",
    "tests/test_debug_stragglers.py::test_call_log", "tests/test_debug_stragglers.py::test_detector_on_a_made_up",
    "tests/test_debug_stragglers.py::test_no_straggler_in_a_made_up", "tests/test_debug_stragglers.py::test_messages",
    "tests/test_fp8_emulation.py",
    "tests/test_megatron_rules.py",
    # the book's build checks: glossary, numbers in prose, figures' style, explorers, notebook tooling
    "tests/test_glossary.py", "tests/test_book_numbers.py", "tests/test_figures_style.py",
    "tests/test_book_explorers.py", "tests/test_notebooks.py",
    # one parity with one device per axis (float64, several microbatches)
    "tests/test_training.py::test_float64_parity_is_exact_to_1e12",                                   # DP
    "tests/test_tensor_parallel.py::test_tensor_parallel_gpt_loss_and_all_grads_equal_dense[2-True-False]",  # TP+SP
    "tests/test_zero.py::test_parity_and_bytes[2]",                                                   # ZeRO
    "tests/test_context_parallel.py::test_losses_grad_norms_and_every_gradient_equal_one_device[cp2 p2p]",  # CP
    "tests/test_pipeline_parallel.py::test_train_losses_equal_single_device[2-2-2]",                  # PP, VPP
    "tests/test_expert_parallel.py::test_every_gradient_equals_one_device[ep2 allgather top1 capacity]",  # EP
)


# The grading slice: real labs graded end to end through the grader's command line, in its sandbox
# (bubblewrap), submission by submission and attack by attack. Its own step of .ci/run
# (LABKIT_GRADING=1 pytest -m grading), like the browser, Slurm and fuzz slices; in the main suite
# these are skipped, with that reason: they are 15 tests and about 480 s of CPU of the suite's
# ~2,300 (2-core machine, 2026-11-28), and the grader's units stay in it (test_grader.py and the
# check tests grade the fixture lab and each Spec in fresh processes).
GRADING = (
    "tests/test_check_new_labs.py::test_memory_knobs_lab_graded_master_full_student_zero_attack_zero",
    "tests/test_fp8_lab.py::test_fp8_lab_graded_master_full_student_zero_attack_zero",
    "tests/test_roofline_lab.py::test_roofline_lab_graded_master_full_student_zero_attack_zero",
    "tests/test_check_new_labs.py::test_recompute_core_graded_in_isolation_hidden_world_size_and_its_ban",
    "tests/test_check_new_labs.py::test_debugging_specs_read_the_seed_and_judge_hidden_shapes",
    "tests/test_check_isolation.py::test_every_attack_fails_its_exercise_when_graded",
    "tests/test_check_isolation.py::test_wrong_ep_split_sizes_and_the_bias_before_the_sum_get_clear_messages",
    "tests/test_check_isolation.py::test_the_honest_answers_pass_when_graded",
    "tests/test_check_resume.py::test_graded_in_isolation_on_a_hidden_case",
    "tests/test_grader.py::test_a_real_lab_unmodified_fails_solved_passes_forged_fails",
    "tests/test_grader_budget.py::test_syscalls_refused_disk_capped_time_capped_honest_full",
    "tests/test_grader_caps.py::test_memory_files_and_open_files_capped_honest_full",
    "tests/test_grader_venv.py::test_a_plain_venv_grades_the_master_full_with_a_relative_workdir",
    "tests/test_grader_attacks.py::test_a_background_process_dies_with_its_grading_and_never_writes_the_gradebook",
    "tests/test_grader_attacks.py::test_a_killed_grader_keeps_every_submission_graded_so_far_and_resumes",
)
GRADING_STEP = "LABKIT_GRADING"


@pytest.hookimpl(tryfirst=True)              # before -m deselects
def pytest_collection_modifyitems(config, items):
    quick_marks(items, config.getoption("markexpr") == "quick")
    grading_marks(items, config.getoption("markexpr") == "grading")
    gpu_skips(items)


def grading_marks(items, strict: bool) -> None:
    """Mark ``grading`` the tests :data:`GRADING` names; skip them (saying where they run) unless
    ``LABKIT_GRADING=1``. ``strict`` (under ``-m grading``): UsageError for a name whose file was
    collected but that matches no test."""
    files = {item.nodeid.split("::")[0] for item in items}
    used = set()
    for item in items:
        if item.nodeid.split("[")[0] in GRADING:
            used.add(item.nodeid.split("[")[0])
            item.add_marker(pytest.mark.grading)
            if not os.environ.get(GRADING_STEP):
                item.add_marker(pytest.mark.skip(reason=(
                    "the grading slice: its own step of .ci/run runs it (LABKIT_GRADING=1 pytest -m grading)")))
    stale = [n for n in GRADING if n.split("::")[0] in files and n not in used]
    if strict and stale:
        raise pytest.UsageError(f"tests/conftest.py GRADING names tests that do not exist: {stale}")


def quick_marks(items, strict: bool) -> None:
    """Mark ``quick`` every collected test :data:`QUICK` names (a file or a node id prefix; of a
    whole file, not the tests marked slow). ``strict`` (under ``-m quick``): UsageError for a name
    whose file was collected but that matches no test."""
    files = {item.nodeid.split("::")[0] for item in items}
    used = set()
    for item in items:
        for name in QUICK:
            if item.nodeid == name or (item.nodeid.startswith(name if "::" in name else name + "::")
                                       and item.get_closest_marker("slow") is None):
                item.add_marker(pytest.mark.quick)
                used.add(name)
    stale = [n for n in QUICK if n.split("::")[0] in files and n not in used]
    if strict and stale:
        raise pytest.UsageError(f"tests/conftest.py QUICK names tests that do not exist: {stale}")


def gpu_skips(items) -> None:
    n = cuda_devices()
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        need = marker.kwargs.get("devices", 1)
        if n < need:
            item.add_marker(pytest.mark.skip(
                reason=f"needs {need} CUDA device(s), found {n}: NCCL path runs on a GPU node only"))


# ---- -n 2 --dist loadscope: the heaviest modules and notebooks first ---------------------------
# xdist's loadscope hands out one scope (a test module, a notebook) at a time to the worker that runs
# out, in order of the number of tests (most first). A scope with few tests but a long run (a notebook
# of 8 cells that trains, two torchrun agents in one test) then comes last, and the other worker
# waits idle for it. Ordered by expected seconds instead (greedy longest-first), the last scopes
# are the short ones and the two workers end together. Only the order changes: every scope runs.
# Expected seconds (a rough model, not measured per scope: only the order depends on it): a notebook
# 15 s to start (a kernel importing torch, its ranks' forkserver importing it again, measured 7 s of
# CPU each) plus 1.5 s per cell; a test module that starts processes 10 s plus 3 s per test; any
# other module 0.2 s per test. SCOPE_SECONDS overrides it for a scope (seconds from `--durations`).
SCOPE_SECONDS: dict[str, float] = {}
STARTS_PROCESSES = ("launch(", "labkit.train(", "subprocess", "torch.distributed.run", "run_hang(")


def scope_seconds(scope: str, tests: int) -> float:
    if scope in SCOPE_SECONDS:
        return SCOPE_SECONDS[scope]
    if scope.endswith(".ipynb"):
        return 15.0 + 1.5 * tests
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), scope.split("::")[0])
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return 0.2 * tests
    return 10.0 + 3.0 * tests if any(s in text for s in STARTS_PROCESSES) else 0.2 * tests


@pytest.hookimpl(optionalhook=True)         # a hook of pytest-xdist (requirements.txt)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LongestFirst(LoadScopeScheduling):
        ordered = False

        def _assign_work_unit(self, node):
            if not self.ordered:            # the first call: xdist has just filled its queue
                self.ordered = True
                order = sorted(self.workqueue.items(), key=lambda kv: -scope_seconds(kv[0], len(kv[1])))
                self.workqueue.clear()
                self.workqueue.update(order)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)
