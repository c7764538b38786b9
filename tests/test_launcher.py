"""Tier 2: labkit.launch on gloo ranks — results, failures, hangs, leaks, output capture, and the
GPU-node path as far as a CPU shows it (issue 15): the caller's environment at each launch,
results on the CPU, the backend decided once, device and process-group arguments, teardown, the
two timeouts, TF32 off, synchronized timers, live output, torchrun with two agents. What only a
GPU shows is marked gpu, at the end."""
import os
import subprocess
import sys
import textwrap
import time

import cloudpickle
import pytest
import torch

import labkit
from labkit.launcher import LaunchTimeout, RankFailed

# Rank functions travel by value, as from a notebook: a rank then need not import this module
# (and pytest), which would cost each launch about a second.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _rank_and_sum(offset):
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} says hello")  # must not reach the caller
    return dist.get_rank() + offset, t.item(), dist.get_world_size()


@pytest.mark.parametrize("world", [1, 2, 4])
def test_results_in_rank_order(world, capfd):
    out = labkit.launch(_rank_and_sum, world, 10)
    assert out == [(r + 10, world * (world - 1) / 2, world) for r in range(world)]
    captured = capfd.readouterr()
    assert "says hello" not in captured.out + captured.err


def _pid_then(action, bad_rank):
    import os
    import time

    import torch.distributed as dist
    from labkit.launcher import send_to_parent
    send_to_parent(("pid", dist.get_rank(), os.getpid()))
    if dist.get_rank() == bad_rank:
        print("about to fail")
        if action == "raise":
            raise ValueError("boom on purpose")
        if action == "exit":
            os._exit(3)
        time.sleep(3600)  # hang
    else:
        dist.barrier()  # the others wait for the bad rank forever
    return "done"


def _gone(pid, within=5.0):
    end = time.time() + within
    while time.time() < end:
        try:
            with open(f"/proc/{pid}/status") as f:
                if "State:\tZ" in f.read():
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _collect_pids():
    pids = []
    return pids, (lambda m: pids.append(m[2]) if isinstance(m, tuple) and m[0] == "pid" else None)


def test_raising_rank_becomes_one_error_and_stops_the_others():
    pids, on_message = _collect_pids()
    t0 = time.time()
    with pytest.raises(RankFailed) as e:
        labkit.launch(_pid_then, 4, "raise", 2, on_message=on_message, timeout=60)
    assert time.time() - t0 < 30  # the barrier-blocked ranks were stopped, not waited for
    err = e.value
    assert err.rank == 2 and "ValueError: boom on purpose" in str(err)
    assert "about to fail" in err.output and "about to fail" in str(err)
    assert len(pids) == 4 and all(_gone(p) for p in pids)


def test_rank_that_dies_without_a_word_is_reported():
    pids, on_message = _collect_pids()
    with pytest.raises(RankFailed, match="exited with code 3"):
        labkit.launch(_pid_then, 2, "exit", 1, on_message=on_message, timeout=60)
    assert all(_gone(p) for p in pids)


def test_hang_times_out_and_names_the_ranks():
    pids, on_message = _collect_pids()
    t0 = time.time()
    with pytest.raises(LaunchTimeout) as e:
        labkit.launch(_pid_then, 3, "hang", 1, on_message=on_message, timeout=3)
    assert 3 <= time.time() - t0 < 20
    assert e.value.unfinished == [0, 1, 2] and "did not finish within 3 s" in str(e.value)
    assert len(pids) == 3 and all(_gone(p) for p in pids)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_world_size(bad):
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        labkit.launch(_rank_and_sum, bad, 0)


def test_nccl_without_gpus_is_a_clear_error():
    from labkit.launcher import resolve_backend
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the error is for CPU-only machines")
    with pytest.raises(ValueError, match="nccl' needs one GPU per rank"):
        resolve_backend("nccl", 2)
    assert resolve_backend("auto", 4) == "gloo"


def test_function_defined_in_unguarded_main_script(tmp_path):
    # A script with no `if __name__ == "__main__":` guard, like a notebook cell.
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import labkit
        def square_rank():
            import torch.distributed as dist
            return dist.get_rank() ** 2
        print("results", labkit.launch(square_rank, 3))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines() == ["results [0, 1, 4]"]


# ---- environment: the caller's, now, at every launch (issue 15, defect 8) ----------------------
_ENV_NAMES = ("LABKIT_TEST_ENV", "NCCL_DEBUG", "CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_WORLD_SIZE")


def _env(names):
    import os
    return {n: os.environ.get(n) for n in names}


def test_callers_current_environment_reaches_each_launch(monkeypatch):
    labkit.launch(_env, 1, (), backend="gloo")  # the forkserver runs now, with the env of this moment
    monkeypatch.setenv("LABKIT_TEST_ENV", "first")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = labkit.launch(_env, 2, _ENV_NAMES, backend="gloo")
    assert out == [{"LABKIT_TEST_ENV": "first", "NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "",
                    "RANK": str(r), "LOCAL_WORLD_SIZE": "2"} for r in range(2)]
    monkeypatch.setenv("LABKIT_TEST_ENV", "second")
    monkeypatch.delenv("NCCL_DEBUG")               # removals reach the ranks too
    out = labkit.launch(_env, 1, _ENV_NAMES[:2], backend="gloo")
    assert out == [{"LABKIT_TEST_ENV": "second", "NCCL_DEBUG": None}]


def test_rank_env_and_torchrun_detection():
    from labkit.launch_rank import rank_env
    from labkit.launcher import under_torchrun
    env = rank_env({"PATH": "/bin", "RANK": "7"}, 1, 4, 29500)
    assert env["PATH"] == "/bin" and env["RANK"] == "1" and env["LOCAL_RANK"] == "1"
    assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "4" and env["MASTER_PORT"] == "29500"
    assert env["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == "0"
    assert "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE" not in rank_env({}, 0, 1, 1, allow_tf32=True)
    assert under_torchrun(env)          # a launch from inside a rank runs in-process, as before
    assert not under_torchrun({"RANK": "0", "WORLD_SIZE": "2"})  # stray variables are not torchrun
    assert under_torchrun({"TORCHELASTIC_RUN_ID": "none"})
    assert not under_torchrun({})


# ---- results come back on the CPU (defect 4) --------------------------------------------------
class _FakeCuda:
    """Stands in for a CUDA tensor on a machine without CUDA."""
    device = torch.device("cuda", 0)

    def cpu(self):
        return "moved"


def test_to_cpu_moves_through_containers_and_dataclasses():
    import collections
    import dataclasses

    from labkit.launch_rank import to_cpu

    @dataclasses.dataclass(frozen=True)
    class Res:
        loss: object
        extra: dict

    Pair = collections.namedtuple("Pair", "a b")
    fake, cpu_t = _FakeCuda(), torch.arange(3.0)
    obj = {"x": fake, "l": [fake, 1, (fake, "s")], "nt": Pair(fake, cpu_t),
           "res": Res(fake, collections.OrderedDict(k=fake)), "size": torch.Size([2, 3])}
    out = to_cpu(obj)
    assert out["x"] == "moved" and out["l"] == ["moved", 1, ("moved", "s")]
    assert isinstance(out["nt"], Pair) and out["nt"].a == "moved" and out["nt"].b is cpu_t  # no copy
    assert out["res"] == Res("moved", collections.OrderedDict(k="moved"))
    assert isinstance(out["res"].extra, collections.OrderedDict) and out["size"] == torch.Size([2, 3])
    assert obj["x"] is fake and obj["res"].loss is fake  # the input is not modified
    shared = [cpu_t, cpu_t]
    again = to_cpu(shared)
    assert again[0] is again[1]


def _tensor_results():
    import dataclasses

    import torch
    import torch.distributed as dist
    from labkit.launcher import device

    @dataclasses.dataclass
    class R:
        t: torch.Tensor
    t = torch.full((2,), float(dist.get_rank()), device=device())
    return {"t": t, "r": R(t * 2)}


def test_results_are_cpu_tensors():
    out = labkit.launch(_tensor_results, 2)
    for r, o in enumerate(out):
        assert o["t"].device.type == "cpu" and o["r"].t.device.type == "cpu"
        torch.testing.assert_close(o["r"].t, torch.full((2,), 2.0 * r))


# ---- backend and device, decided once (defects 3 and 7) ---------------------------------------
def test_auto_backend_is_decided_once_per_process(monkeypatch, capsys):
    from labkit import launcher
    monkeypatch.delenv("LABKIT_BACKEND", raising=False)
    monkeypatch.setattr(launcher, "gpu_count", lambda: 2)  # pretend: a node with 2 GPUs
    monkeypatch.setattr(launcher, "_auto", None)
    assert launcher._auto_backend(2) == "nccl" and launcher.backend_in_use() == "nccl"
    assert "backend 'auto' is 'nccl'" in capsys.readouterr().err      # said once, at the decision
    assert launcher._auto_backend(1) == "nccl" and capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="world_size 4 > 2 GPUs; pass backend='gloo'"):
        launcher._auto_backend(4)
    launcher.choose_backend(None)
    assert launcher._auto_backend(4) == "gloo"  # first decision at 4 ranks > 2 GPUs: CPU ...
    assert launcher._auto_backend(2) == "gloo"  # ... and the 2-rank run of the same study too
    monkeypatch.setenv("LABKIT_BACKEND", "gloo")
    launcher.choose_backend(None)
    assert launcher._auto_backend(2) == "gloo"
    monkeypatch.setattr(launcher, "gpu_count", lambda: 0)
    monkeypatch.setenv("LABKIT_BACKEND", "nccl")
    launcher.choose_backend(None)
    with pytest.raises(ValueError, match="needs one GPU per rank"):
        launcher._auto_backend(2)
    with pytest.raises(ValueError, match="backend must be one of"):
        launcher.choose_backend("mpi")


def _backend_and_device():
    from labkit.launcher import backend_in_use, device
    return backend_in_use(), str(device())


def test_rank_knows_its_backend_and_device(auto_backend):
    from labkit import launcher
    out = labkit.launch(_backend_and_device, 2)
    expected = launcher.backend_in_use()  # the caller learns what auto meant
    assert expected in ("gloo", "nccl")
    assert out == [(expected, "cpu" if expected == "gloo" else f"cuda:{r}") for r in range(2)]


def test_device_comes_from_start_for_any_nccl_backend(monkeypatch):
    from labkit import launch_rank, launcher
    calls = []
    monkeypatch.setattr(launch_rank.torch.cuda, "set_device", calls.append)
    for name in ("device", "backend"):
        monkeypatch.setattr(launch_rank.state, name, None)
    for flag in ("allow_tf32",):  # start() sets TF32 flags: restore them after the test
        monkeypatch.setattr(torch.backends.cuda.matmul, flag, torch.backends.cuda.matmul.allow_tf32)
        monkeypatch.setattr(torch.backends.cudnn, flag, torch.backends.cudnn.allow_tf32)
    assert launcher.device() == torch.device("cpu")  # no rank, no group: the CPU
    launch_rank.start("cpu:gloo,cuda:nccl", 1, allow_tf32=False)
    assert launcher.device() == torch.device("cuda", 1) and calls == [torch.device("cuda", 1)]
    assert launcher.backend_in_use() == "cpu:gloo,cuda:nccl"
    launch_rank.start("gloo", 1, allow_tf32=False)
    assert launcher.device() == torch.device("cpu") and len(calls) == 1


def test_process_group_arguments():
    import datetime

    from labkit.launch_rank import process_group_kwargs
    assert process_group_kwargs("gloo", 3, 42.0) == {"timeout": datetime.timedelta(seconds=42)}
    for backend in ("nccl", "cpu:gloo,cuda:nccl"):  # device_id binds the communicator to the GPU
        assert process_group_kwargs(backend, 3, 600) == {
            "timeout": datetime.timedelta(seconds=600), "device_id": torch.device("cuda", 3)}


# ---- teardown, timeouts (defect 10) -----------------------------------------------------------
def _report_teardown():
    import torch.distributed as dist
    from labkit import launch_rank
    from labkit.launcher import send_to_parent
    sub = dist.new_group([0, 1])  # a subgroup: destroyed too
    real = launch_rank.finish

    def finish():
        real()
        send_to_parent(("destroyed", not dist.is_initialized()))
    launch_rank.finish = finish
    dist.barrier(group=sub)
    return "ok"


def test_rank_destroys_its_process_groups_before_reporting():
    seen = []
    out = labkit.launch(_report_teardown, 2, on_message=seen.append)
    assert out == ["ok", "ok"] and seen == [("destroyed", True)] * 2


def test_finish_destroys_default_group_and_subgroups():
    import torch.distributed as dist
    from labkit.launch_rank import finish
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sub = dist.new_group([0])
        registry = dist.distributed_c10d._world.pg_map  # every live group of this process
        assert sub in registry and len(registry) == 2
        finish()
        assert not dist.is_initialized() and len(registry) == 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _barrier_after(sleep_rank, seconds):
    import time

    import torch.distributed as dist
    if dist.get_rank() == sleep_rank:
        time.sleep(seconds)
    dist.barrier()


def test_collective_timeout_is_not_the_launch_timeout():
    t0 = time.time()
    with pytest.raises(RankFailed, match="Timed out") as e:  # the collective gives up, the launch does not
        labkit.launch(_barrier_after, 2, 1, 60, backend="gloo", timeout=120, collective_timeout=1.5)
    assert e.value.rank == 0 and time.time() - t0 < 60
    with pytest.raises(ValueError, match="collective_timeout must be a finite number of seconds > 0"):
        labkit.launch(_barrier_after, 2, 1, 0, collective_timeout=0)


# ---- TF32 off in ranks (defect 9) -------------------------------------------------------------
def _tf32_state():
    import os

    import torch
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"))


def test_tf32_is_off_in_ranks_unless_asked(monkeypatch):
    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")  # as in NGC containers
    assert labkit.launch(_tf32_state, 1) == [(False, False, "0")]
    assert labkit.launch(_tf32_state, 1, allow_tf32=True) == [(True, True, "1")]


# ---- honest timings ---------------------------------------------------------------------------
def test_synchronize_waits_only_on_cuda(monkeypatch):
    from labkit import launcher
    calls = []
    monkeypatch.setattr(launcher.torch.cuda, "synchronize", calls.append)
    launcher.synchronize()                   # this process: CPU
    launcher.synchronize("cpu")
    assert calls == []
    launcher.synchronize(torch.device("cuda", 1))
    assert calls == [torch.device("cuda", 1)]
    monkeypatch.setattr(launcher, "device", lambda: torch.device("cuda", 0))  # as in an NCCL rank
    calls.clear()
    with launcher.timer() as t:
        calls.append("work")
    assert calls == [torch.device("cuda", 0), "work", torch.device("cuda", 0)]  # before and after
    assert t.seconds >= 0


def test_timer_measures_wall_time_on_cpu():
    from labkit.launcher import now, timer
    with timer() as t:
        time.sleep(0.05)
    assert t.seconds >= 0.05
    a = now()
    assert now() >= a


# ---- live output (issue 13, item 5) -----------------------------------------------------------
def test_live_output_prints_complete_lines_as_they_come(tmp_path):
    from labkit.launch_collect import LiveOutput
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
    logs[0].write_text("one\ntw")
    seen = []
    live = LiveOutput([str(p) for p in logs], write=seen.append)
    live.poll()
    assert seen == ["[rank 0] one"]  # rank 1 has no file yet; "tw" waits for its newline
    with open(logs[0], "a") as f:
        f.write("o\nthree")
    logs[1].write_text("hi\n")
    live.poll()
    assert seen == ["[rank 0] one", "[rank 0] two", "[rank 1] hi"]
    live.poll(final=True)
    assert seen[-1] == "[rank 0] three"


def _say(word):
    import torch.distributed as dist
    print(f"{word} from {dist.get_rank()}")


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_live_output_shows_rank_prints(how, monkeypatch, capsys):
    if how == "environment":
        monkeypatch.setenv("LABKIT_LIVE_OUTPUT", "1")
    labkit.launch(_say, 2, "hi", **({"live_output": True} if how == "argument" else {}))
    out = capsys.readouterr().out
    assert "[rank 0] hi from 0" in out and "[rank 1] hi from 1" in out
    monkeypatch.delenv("LABKIT_LIVE_OUTPUT", raising=False)
    labkit.launch(_say, 2, "quiet")
    assert "quiet" not in capsys.readouterr().out  # the default stays quiet


# ---- multi-node torchrun: two agents on this machine ------------------------------------------
def test_under_two_torchrun_agents_runs_in_process(tmp_path):
    # two agents (nodes) of one process each, as on two machines: launch runs fn in each process
    import socket
    script = tmp_path / "tr2.py"
    script.write_text(textwrap.dedent("""
        import os, labkit
        def who():
            import torch.distributed as dist
            return dist.get_rank(), os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"], os.getpid()
        out = labkit.launch(who, 2)
        node = int(os.environ["GROUP_RANK"])
        print("node", node, "sees", [o[:3] for o in out], "in-process", out[node][3] == os.getpid())
    """))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--master-addr", "127.0.0.1", "--master-port", str(port)]
    agents = [subprocess.Popen(cmd + ["--node-rank", str(k), str(script)], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE) for k in range(2)]
    outs = [a.communicate(timeout=120) for a in agents]
    for a, (out, err) in zip(agents, outs):
        assert a.returncode == 0, err[-2000:]
    expected = "[(0, '0', '1'), (1, '0', '1')]"  # global ranks 0, 1; each alone on its node
    for k in range(2):
        assert f"node {k} sees {expected} in-process True" in outs[k][0]


# ---- what only a GPU can show (marked gpu: skipped on CPU by tests/conftest.py) ----------------
def _gpu_count():
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _nccl_rank():
    import torch
    import torch.distributed as dist
    from labkit.launcher import device
    t = torch.ones(4, device=device()) * dist.get_rank()
    dist.all_reduce(t)
    return dist.get_backend(), str(device()), torch.cuda.current_device(), t   # t: CUDA in the rank


@pytest.mark.gpu(devices=1)
def test_nccl_at_world_size_equal_number_of_gpus():
    n = _gpu_count()
    out = labkit.launch(_nccl_rank, n, backend="nccl")
    total = float(sum(range(n)))
    for r, (backend, dev, current, t) in enumerate(out):
        assert backend == "nccl" and dev == f"cuda:{r}" and current == r   # one GPU per rank
        assert t.device.type == "cpu"                                     # results back on CPU
        torch.testing.assert_close(t, torch.full((4,), total))


@pytest.mark.gpu(devices=2)
def test_mixed_backend_takes_cpu_and_cuda_tensors():
    def f():
        import torch
        import torch.distributed as dist
        from labkit.launcher import device
        a, b = torch.ones(2), torch.ones(2, device=device())  # CPU -> gloo, CUDA -> NCCL
        dist.all_reduce(a)
        dist.all_reduce(b)
        return str(device()), a, b
    out = labkit.launch(f, 2, backend="cpu:gloo,cuda:nccl")
    assert [o[0] for o in out] == ["cuda:0", "cuda:1"]
    assert all(o[1].tolist() == o[2].tolist() == [2.0, 2.0] for o in out)


@pytest.mark.gpu(devices=2)
def test_cuda_visible_devices_set_after_a_launch_reaches_the_ranks(monkeypatch):

    def f():
        import torch
        return torch.cuda.device_count(), torch.cuda.get_device_name(0)
    labkit.launch(f, 1, backend="nccl")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert labkit.launch(f, 1, backend="nccl") == [(1, torch.cuda.get_device_name(1))]


@pytest.mark.gpu(devices=1)
def test_one_gpu_rank_fp32_matmul_with_tf32_off(monkeypatch):
    # fp32 on the GPU, TF32 off, against float64 on the CPU: K=4096 sums stay near fp32 round-off
    # (about sqrt(K) * 6e-8 relative); TF32's 10-bit mantissa would give about 1e-3.
    def f(allow):
        import torch
        from labkit.launcher import device
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(256, 4096, generator=g), torch.randn(4096, 256, generator=g)
        got = (a.to(device()) @ b.to(device())).cpu().double()
        ref = a.double() @ b.double()
        return torch.backends.cuda.matmul.allow_tf32, ((got - ref).norm() / ref.norm()).item()
    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")  # as in NGC containers
    [(flag, err)] = labkit.launch(f, 1, False, backend="nccl")
    assert flag is False and err < 1e-5, err
    if torch.cuda.get_device_capability(0)[0] >= 8:   # TF32 exists from Ampere on
        [(flag, err_tf32)] = labkit.launch(f, 1, True, backend="nccl", allow_tf32=True)
        assert flag is True and err_tf32 > 10 * err   # the opt-in really changes the math


@pytest.mark.gpu(devices=1)
def test_timer_includes_the_gpu_work():
    def f():
        import torch
        from labkit.launcher import device, timer
        x = torch.randn(8192, 8192, device=device())
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with timer() as t:
            start.record()
            for _ in range(20):
                y = x @ x
            end.record()
        end.synchronize()
        return t.seconds, start.elapsed_time(end) / 1e3, y.shape
    [(wall, gpu, _)] = labkit.launch(f, 1, backend="nccl")
    assert wall >= 0.95 * gpu, (wall, gpu)   # without the synchronize: launch time only
