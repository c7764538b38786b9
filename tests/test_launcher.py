"""Tier 2: labkit.launch on gloo ranks — results, failures, hangs, leaks, output capture."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

import labkit
from labkit.launcher import LaunchTimeout, RankFailed


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
    import torch
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


def test_under_torchrun_runs_in_process(tmp_path):
    script = tmp_path / "tr.py"
    script.write_text(textwrap.dedent("""
        import os, labkit
        def who():
            import torch.distributed as dist
            return (dist.get_rank(), os.getpid())
        out = labkit.launch(who, 2)
        if os.environ["RANK"] == "0":
            print("ranks", [r for r, _ in out], "in-process", out[0][1] == os.getpid())
    """))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(script)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ranks [0, 1] in-process True" in out.stdout


@pytest.mark.gpu(devices=2)
def test_nccl_all_reduce_one_rank_per_gpu():
    def f():
        import torch
        import torch.distributed as dist
        from labkit.launcher import device
        t = torch.ones(4, device=device()) * dist.get_rank()
        dist.all_reduce(t)
        return dist.get_backend(), str(t.device), t.sum().item()
    out = labkit.launch(f, 2, backend="nccl")
    assert [o[0] for o in out] == ["nccl", "nccl"] and out[1][1] == "cuda:1" and out[0][2] == 4.0
