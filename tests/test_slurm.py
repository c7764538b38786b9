"""The course's Slurm job, run under a real Slurm cluster: two nodes on one machine.

A module fixture starts ``examples/slurm/local_cluster.py``'s cluster in a temporary folder: one
``slurmctld`` and two ``slurmd -N n1|n2`` of Debian's slurm-wlm, ``AuthType=auth/none``,
``CredType=cred/none``, every daemon on 127.0.0.1 at its own free port, its own state and spool
folders, torn down after. The node names need no name service (``NodeAddr=127.0.0.1``). Process
tracking: ``proctrack/linuxproc`` (Slurm walks /proc from each step's first process; torchrun's
ranks run in sessions of their own, which ``proctrack/pgid`` would miss).

The tests submit ``examples/slurm/train_cpu.sbatch`` from the repository root with ``sbatch`` and
check: exit 0 and the losses of ``labkit.reference``, no traceback in the job's output (with the
second node's agent held in its exit barrier: the exit order that used to end in a traceback), no
process of the job left on either node; a planted failing rank ends the job at once and is named
first; ``scancel`` stops every rank on both nodes within KillWait; the script
``experiments run ID --slurm`` writes runs too. Skipped, with the reason, where Slurm is not
installed or cannot run (it needs root).
"""
import importlib.util
import re
import shlex
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "slurm" / "train_cpu.sbatch"
RECORD = ROOT / "examples" / "slurm" / "train_cpu.record.json"
BAD = re.compile(r"Traceback|Exception|Error|frame #\d")          # what a clean end never prints
ERROR = re.compile(r"(\[rank\d+\]: )?[\w.]*(Error|Exception): ")   # a traceback's last line

_spec = importlib.util.spec_from_file_location("local_cluster", ROOT / "examples" / "slurm" / "local_cluster.py")
local_cluster = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(local_cluster)
NOTHING_LEFT = {n: [] for n in local_cluster.NODES}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = local_cluster.unavailable()
    if why:
        pytest.skip(f"{why}; .ci/run installs slurm-wlm")
    c = local_cluster.Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
    except (RuntimeError, OSError) as err:     # start() has stopped what it started
        pytest.skip(f"Slurm is installed but cannot run here: {err}")
    yield c
    c.stop()


def script_config() -> tuple[int, dict]:
    """The world size and the ``labkit train`` flags of train_cpu.sbatch (argparse's names)."""
    from labkit.__main__ import train_parser
    text = SCRIPT.read_text()
    nodes = int(re.search(r"#SBATCH --nodes=(\d+)", text).group(1))
    per_node = int(re.search(r"launch\.sh (\d+) -m labkit train", text).group(1))
    words = shlex.split(text.split("-m labkit train", 1)[1].replace("\\\n", " "))
    args = vars(train_parser().parse_args([w for w in words if w != "$@"]))
    args["data_path"] = str(ROOT / args["data_path"])
    return nodes * per_node, args


def reference_losses() -> list[float]:
    """train_cpu.sbatch's run on one device, in float64 (``labkit.reference``)."""
    import torch

    from labkit.config import TrainConfig
    from labkit.reference import train_reference
    world, args = script_config()
    defaults = {f: v.default for f, v in TrainConfig.__dataclass_fields__.items()}
    config = {k: v for k, v in args.items() if k in defaults and v != defaults[k]}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                # as each rank runs (OMP_NUM_THREADS=1 in the script)
    try:
        return train_reference(world_size=world, steps=args["steps"], seed=args["seed"], **config)
    finally:
        torch.set_num_threads(threads)


def check_clean_run(run: dict) -> list[float]:
    """A successful job's checks; returns the losses it logged."""
    from labkit.megatron_bridge import parse_log
    out = run["output"]
    assert (run["state"], run["exit_code"]) == ("COMPLETED", "0:0"), out[-4000:]
    assert not BAD.search(out), out[-4000:]
    log = parse_log(out)
    _, args = script_config()
    assert list(log["iteration"]) == list(range(1, args["steps"] + 1))
    for printed, exact in zip(log["lm_loss"], reference_losses()):   # "%.6E": 7 significant digits
        assert abs(printed - exact) <= 5e-7 * abs(exact), (printed, exact)
    return list(log["lm_loss"])


def check_failed_run(run: dict) -> None:
    """A job whose rank 3 raised in iteration 2: it failed at once, and rank 3's error comes first."""
    out = run["output"]
    assert run["state"] == "FAILED" and run["exit_code"] != "0:0", out[-4000:]
    errors = [line for line in out.splitlines() if ERROR.match(line)]
    assert errors[0] == "[rank3]: RuntimeError: planted failure in iteration 2", errors
    causes = re.findall(r"Root Cause \(first observed failure\):\n\[0\]:\n(?:.*\n){2}\s+rank\s+: (\d+)", out)
    assert causes[:1] == ["3"], out[-4000:]              # torchrun's summary names rank 3 first
    assert len(re.findall(r"iteration\s+\d+/\s*50 \|", out)) <= 2, out   # ended at once, not at 50


def test_train_cpu_sbatch_matches_one_device_and_ends_clean(cluster):
    # SLURM_EXACT: srun steps get only what they ask for (srun --exact), as on clusters that set it
    run = local_cluster.run_and_watch(cluster, SCRIPT, plant="slow-agent", env={"SLURM_EXACT": "1"})
    assert "held 3 s in the exit barrier" in run["output"], run["output"][-2000:]   # the adverse order
    losses = check_clean_run(run)
    # while it ran: two ranks on each node (which node is node 0 is the rendezvous' choice)
    assert sorted(local_cluster.ranks(run["processes"]).values()) == [[0, 1], [2, 3]], run["processes"]
    # each rank may run on all the cores the job asked per agent (--cpus-per-task): Slurm
    # 22.05-23.02's srun does not inherit it from sbatch, so an exact step would get one CPU and
    # task/affinity would bind the agent and every rank it starts to it (launch.sh says it again)
    want = int(re.search(r"#SBATCH --cpus-per-task=(\d+)", SCRIPT.read_text()).group(1))
    cpus = {p["env"]["RANK"]: p["cpus"] for ps in run["processes"].values() for p in ps if "RANK" in p["env"]}
    assert sorted(cpus) == ["0", "1", "2", "3"] and all(len(c) == want for c in cpus.values()), cpus
    assert run["left"] == NOTHING_LEFT
    print(f"job {run['job_id']}: {run['wall_s']} s from sbatch to its end; losses {losses}; CPUs {cpus}")


def test_a_failing_rank_ends_the_job_and_is_named_first(cluster):
    run = local_cluster.run_and_watch(cluster, SCRIPT, "--train-iters", "50", plant="failing-rank")
    check_failed_run(run)
    assert run["left"] == NOTHING_LEFT
    print(f"job {run['job_id']} (rank 3 fails): {run['wall_s']} s from sbatch to its end")


def test_a_rank_killed_on_the_second_node_restarts_and_the_job_ends_right(cluster, tmp_path):
    """Rank 3 (a node other than rank 0's) is SIGKILLed before iteration 4 (labkit.restart's fault,
    once: a marker in the save folder). torchrun --max-restarts 1 (LABKIT_MAX_RESTARTS) restarts
    every agent's ranks, the store beside the batch script survives, ``--load`` resumes from the
    checkpoint of iteration 2 (iteration 3 runs again), and the job ends COMPLETED with one device's losses."""
    from labkit.megatron_bridge import parse_log
    save = tmp_path / "ckpt"
    run = local_cluster.run_and_watch(cluster, SCRIPT, "--train-iters", "4", "--save", str(save), "--load", str(save),
                                      "--save-interval", "2",
                                      env={"LABKIT_MAX_RESTARTS": "1", "LABKIT_FAULTS": "3@3:SIGKILL"})
    out = run["output"]
    assert (run["state"], run["exit_code"]) == ("COMPLETED", "0:0"), out[-4000:]
    assert (save / ".faults" / "rank3-step3-SIGKILL").exists(), "the fault never fired"
    assert "labkit fault: rank 3 fails by SIGKILL" in out, out[-4000:]
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    log = parse_log(out)
    last = dict(zip(log["iteration"], log["lm_loss"]))          # an iteration logged again after the restart
    assert sorted(last) == [1, 2, 3, 4] and len(log["iteration"]) > 4, list(log["iteration"])
    world, args = script_config()
    from labkit.config import TrainConfig
    from labkit.reference import train_reference
    defaults = {f: v.default for f, v in TrainConfig.__dataclass_fields__.items()}
    config = {k: v for k, v in args.items() if k in defaults and v != defaults[k]}
    exact = train_reference(world_size=world, steps=4, seed=args["seed"], **config)
    for it in range(1, 5):
        assert abs(last[it] - exact[it - 1]) <= 5e-7 * abs(exact[it - 1]), (it, last[it], exact[it - 1])
    assert run["left"] == NOTHING_LEFT
    print(f"job {run['job_id']} (rank 3 killed, restarted): {run['wall_s']} s; final loss {last[4]}")


def test_scancel_stops_every_rank_on_both_nodes(cluster):
    job_id = cluster.submit(SCRIPT, "--train-iters", "100000")
    deadline = time.monotonic() + 300
    while sorted(local_cluster.ranks(local_cluster.job_processes(job_id)).values()) != [[0, 1], [2, 3]]:
        assert time.monotonic() < deadline, (cluster.job(job_id), local_cluster.job_processes(job_id))
        assert cluster.job(job_id)["JobState"] not in local_cluster.DONE, cluster.output(job_id)
        time.sleep(0.2)
    kill_wait = local_cluster.KILL_WAIT
    start, ranks_gone, after_kill = time.monotonic(), None, None
    cluster.run("scancel", str(job_id))
    while any((found := local_cluster.job_processes(job_id)).values()) and time.monotonic() - start < 60:
        if ranks_gone is None and not any(local_cluster.ranks(found).values()):
            ranks_gone = time.monotonic() - start
        if after_kill is None and time.monotonic() - start > kill_wait + 1:
            after_kill = found                  # what outlived the SIGKILL, for the message below
        time.sleep(0.1)
    gone = time.monotonic() - start
    ranks_gone = gone if ranks_gone is None else ranks_gone
    assert local_cluster.job_processes(job_id) == NOTHING_LEFT
    assert cluster.wait(job_id, timeout=60)["JobState"] == "CANCELLED"
    # Slurm sends SIGTERM to every process of the job, then SIGKILL after KillWait to what is left.
    # The ranks end on the SIGTERM; the rest (agents, the store, the step daemons finishing their
    # own work) within a few KillWaits, however loaded the machine: a process that outlived the
    # SIGKILL round would live on for good
    assert ranks_gone < kill_wait, f"ranks of job {job_id} lived {ranks_gone:.1f} s after scancel"
    assert gone < 4 * kill_wait, f"job {job_id} lived {gone:.1f} s after scancel: {after_kill}"
    print(f"job {job_id}: every rank gone {ranks_gone:.1f} s, every process {gone:.1f} s after scancel")


def test_experiments_slurm_script_runs(cluster, tmp_path):
    from labkit.experiments.slurm import write_script
    path = write_script("train-tp2-gpt2-large-2gpu", scale="cpu", nodes=2, outdir=tmp_path, steps=2)
    job_id = cluster.submit(path)
    info = cluster.wait(job_id)
    out = cluster.output(job_id)            # (submit sends Slurm's output to the cluster's folder)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), out[-4000:]
    assert not BAD.search(out), out[-4000:]
    log = (tmp_path / "train-tp2-gpt2-large-2gpu" / "logs.txt").read_text()
    assert len(re.findall(r"^ iteration", log, flags=re.M)) == 2, log
    assert len(re.findall(r"^\[Rank \d\]", log, flags=re.M)) == 2, log     # one memory line per rank
    assert local_cluster.left_after(job_id) == NOTHING_LEFT
