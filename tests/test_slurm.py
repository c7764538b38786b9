"""The course's Slurm job, run under a real Slurm cluster: two nodes on one machine.

A module fixture starts Debian's slurm-wlm in a temporary folder: one ``slurmctld`` and two
``slurmd -N n1|n2``, ``AuthType=auth/none``, ``CredType=cred/none``, every daemon on 127.0.0.1 at
its own free port, its own state and spool folders, torn down after. The node names need no name
service: ``NodeAddr=127.0.0.1`` tells Slurm (and ``examples/slurm/launch.sh``, which reads
``NodeAddr``) where each node is. Process tracking is ``proctrack/linuxproc``: Slurm finds a step's
processes by walking /proc from the step's first process (torchrun starts its ranks in sessions of
their own, so ``proctrack/pgid`` would miss them; cgroups are often unavailable in containers).

The tests submit ``examples/slurm/train_cpu.sbatch`` from the repository root with ``sbatch`` and
check: exit 0 and the losses of ``labkit.reference``, no traceback in the job's output (with the
second node's agent held in its exit barrier, the order that used to end in a traceback), no
process of the job left on either node; a planted failing rank ends the job, named first; ``scancel``
stops every rank on both nodes; the script ``experiments run ID --slurm`` writes runs too.
Skipped, with the reason, where Slurm is not installed or cannot run (it needs root).
"""
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "slurm" / "train_cpu.sbatch"
NODES = ("n1", "n2")
JOB_TIMEOUT = 300           # s: a job that has not ended by then is cancelled and the test fails
BAD = re.compile(r"Traceback|Exception|Error|frame #\d")   # what a clean end never prints
ERROR = re.compile(r"(\[rank\d+\]: )?[\w.]*(Error|Exception): ")   # the last line of a traceback

SLOW_AGENT = '''# test_slurm: the second node's agent waits 3 s after checking into torchrun's exit barrier,
# so the first node's agent always leaves first (the order that ended in a traceback before)
import os, sys, time
if os.environ.get("SLURM_NODEID") == "1" and "RANK" not in os.environ:
    import torch.distributed.elastic.utils.store as _store
    _checkin = _store._barrier_nonblocking
    def _slow(*args, **kwargs):
        key = _checkin(*args, **kwargs)
        print("test_slurm: the agent on node 1 is held 3 s in the exit barrier", file=sys.stderr, flush=True)
        time.sleep(3)
        return key
    _store._barrier_nonblocking = _slow
'''
FAILING_RANK = '''# test_slurm: rank 3 fails in its second iteration
import os
if os.environ.get("RANK") == "3":
    import labkit.indexed_dataset as _data
    _get_batch = _data.get_batch
    def _planted(path, iteration, *args, **kwargs):
        if iteration == 1:
            raise RuntimeError("planted failure in iteration 2")
        return _get_batch(path, iteration, *args, **kwargs)
    _data.get_batch = _planted
'''


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def slurm_conf(d: Path, ctld: int, slurmd: list[int]) -> str:
    nodes = "\n".join(f"NodeName={n} NodeAddr=127.0.0.1 Port={p} CPUs=2 State=UNKNOWN"
                      for n, p in zip(NODES, slurmd))
    return f"""ClusterName=labkit-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd[0]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/linear
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=60 State=UP
"""


class Cluster:
    def __init__(self, folder: Path):
        self.dir, self.daemons = folder, []
        (folder / "state").mkdir()
        for n in NODES:
            (folder / "spool" / n).mkdir(parents=True)
        ctld, *slurmd = free_ports(1 + len(NODES))
        self.conf = folder / "slurm.conf"
        self.conf.write_text(slurm_conf(folder, ctld, slurmd))
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        cmds = [["slurmctld", "-D", "-i", "-f", str(self.conf)]]
        cmds += [["slurmd", "-D", "-N", n, "-f", str(self.conf)] for n in NODES]
        for cmd in cmds:
            log = open(self.dir / f"{cmd[0]}-{cmd[3] if cmd[0] == 'slurmd' else 'ctld'}.stderr", "w")
            self.daemons.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=log))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout.split()
            if states == [w for n in NODES for w in (n, "idle")]:
                return
            if any(p.poll() is not None for p in self.daemons):
                break
            time.sleep(0.5)
        logs = "\n".join(f.read_text()[-1500:] for f in sorted(self.dir.glob("*.log")))
        raise RuntimeError(f"the two-node cluster did not come up (sinfo: {states}):\n{logs}")

    def stop(self) -> None:
        """Cancel what runs, wait for it to end, stop the daemons (the slurmd first)."""
        if self.daemons and self.daemons[0].poll() is None:
            self.run("scancel", "--partition=debug", check=False)
            deadline = time.monotonic() + 30
            while self.run("squeue", "-h", check=False).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.5)
        for p in reversed(self.daemons):    # the slurmd first, then the controller
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60, check=check)

    def submit(self, *args: str, python_path: str | None = None) -> int:
        env = dict(self.env)
        if python_path:   # a sitecustomize.py the job's Python processes load first
            env["PYTHONPATH"] = os.pathsep.join([python_path, env.get("PYTHONPATH", str(ROOT))])
        out = subprocess.run(["sbatch", "--parsable", "--time=5", f"--output={self.dir}/%x-%j.out", *args],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
        return int(out.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict:
        line = self.run("scontrol", "show", "job", "-o", str(job_id)).stdout
        return dict(f.split("=", 1) for f in line.split() if "=" in f)

    def wait(self, job_id: int, timeout: float = JOB_TIMEOUT) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info["JobState"] not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                return info
            time.sleep(0.5)
        self.run("scancel", str(job_id), check=False)
        raise AssertionError(f"job {job_id} still {info['JobState']} after {timeout} s:\n{self.output(job_id)}")

    def output(self, job_id: int) -> str:
        (path,) = self.dir.glob(f"*-{job_id}.out")
        return path.read_text()


def job_processes(job_id: int) -> dict[str, list[str]]:
    """Every live process of ``job_id``, by node: each node's slurmstepd of the job (its title
    ``slurmstepd: [ID.step]``, its node from the node's log file it holds open) with its process
    tree, and every process whose environment carries the job's id (so a process that left its
    tree is found too)."""
    procs = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = (Path("/proc", pid, "cmdline").read_bytes().replace(b"\0", b" ").decode().strip())
            env = dict(kv.split("=", 1) for kv in Path("/proc", pid, "environ").read_bytes().decode(
                errors="replace").split("\0") if "=" in kv)
            ppid = Path("/proc", pid, "stat").read_text().rsplit(")", 1)[1].split()[1]
            logs = [os.readlink(f) for f in Path("/proc", pid, "fd").iterdir()
                    if "slurmd-" in os.readlink(f)] if cmd.startswith("slurmstepd") else []
        except (OSError, ValueError):
            continue                        # gone while we looked
        procs[pid] = (ppid, cmd, env, logs)
    found = {n: [] for n in NODES}
    for pid, (ppid, cmd, env, logs) in procs.items():
        node = None
        if cmd.startswith(f"slurmstepd: [{job_id}."):
            node = next((n for n in NODES for f in logs if f.endswith(f"slurmd-{n}.log")), "?")
        elif env.get("SLURM_JOB_ID") == str(job_id):
            node = env.get("SLURMD_NODENAME", "?")
        else:                               # a descendant of the job's slurmstepd?
            up = ppid
            while up in procs and not procs[up][1].startswith(f"slurmstepd: [{job_id}."):
                up = procs[up][0]
            if up in procs:
                node = "?"
        if node is not None:
            found.setdefault(node, []).append(f"{pid} {env.get('RANK', '-')} {cmd[:100]}")
    return found


def left_after(job_id: int, grace: float = 10.0) -> dict[str, list[str]]:
    """What is left of ``job_id`` once Slurm has cleaned up: a job reads COMPLETED as soon as its
    batch script exits, and its step daemons then end what remains (KillWait=5 s, then SIGKILL)."""
    deadline = time.monotonic() + grace
    while any((found := job_processes(job_id)).values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def ranks_on(found: dict) -> dict[str, list[str]]:
    """The training ranks (torchrun's workers, RANK in their environment) in ``job_processes``."""
    return {n: sorted(p.split()[1] for p in ps if p.split()[1] != "-") for n, ps in found.items()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = [c for c in ("slurmctld", "slurmd", "sbatch", "scontrol", "srun") if not shutil.which(c)]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} not found; Debian: apt-get install "
                    f"slurm-wlm, as .ci/run does)")
    if os.geteuid() != 0:
        pytest.skip("a local Slurm cluster needs root (slurmd starts job steps as the job's user)")
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
    except (RuntimeError, OSError) as err:
        c.stop()
        pytest.skip(f"Slurm is installed but cannot run here: {err}")
    yield c
    c.stop()


def script_config() -> tuple[int, dict]:
    """The world size and the ``labkit train`` flags of train_cpu.sbatch, as TrainConfig fields."""
    from labkit.__main__ import train_parser
    text = SCRIPT.read_text()
    nodes = int(re.search(r"#SBATCH --nodes=(\d+)", text).group(1))
    per_node = int(re.search(r"launch\.sh (\d+) -m labkit train", text).group(1))
    words = shlex.split(text.split("-m labkit train", 1)[1].replace("\\\n", " "))
    args = vars(train_parser().parse_args([w for w in words if w != "$@"]))
    args["data_path"] = str(ROOT / args["data_path"])
    return nodes * per_node, args


def test_train_cpu_sbatch_matches_one_device_and_ends_clean(cluster, tmp_path):
    import torch

    from labkit.config import TrainConfig
    from labkit.megatron_bridge import parse_log
    from labkit.reference import train_reference
    (tmp_path / "sitecustomize.py").write_text(SLOW_AGENT)
    start = time.monotonic()
    job_id = cluster.submit(str(SCRIPT), python_path=str(tmp_path))
    info = cluster.wait(job_id)
    wall = time.monotonic() - start
    out = cluster.output(job_id)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), out[-4000:]
    assert "held 3 s in the exit barrier" in out, out[-2000:]   # the adverse exit order happened
    assert not BAD.search(out), out[-4000:]                     # ... and ended clean
    assert left_after(job_id) == {n: [] for n in NODES}
    world, args = script_config()
    log = parse_log(out)
    steps, seed = args["steps"], args["seed"]
    assert list(log["iteration"]) == list(range(1, steps + 1))
    defaults = {f: v.default for f, v in TrainConfig.__dataclass_fields__.items()}
    config = {k: v for k, v in args.items() if k in defaults and v != defaults[k]}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                # as each rank runs (OMP_NUM_THREADS=1 in the script)
    try:
        ref = train_reference(world_size=world, steps=steps, seed=seed, **config)
    finally:
        torch.set_num_threads(threads)
    for printed, exact in zip(log["lm_loss"], ref):            # "%.6E": 7 significant digits
        assert abs(printed - exact) <= 5e-7 * abs(exact), (printed, exact)
    print(f"job {job_id}: {wall:.1f} s from sbatch to the end; losses {list(log['lm_loss'])}")


def test_a_failing_rank_ends_the_job_and_is_named_first(cluster, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(FAILING_RANK)
    job_id = cluster.submit(str(SCRIPT), "--train-iters", "50", python_path=str(tmp_path))
    info = cluster.wait(job_id)
    out = cluster.output(job_id)
    assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0", out[-4000:]
    errors = [line for line in out.splitlines() if ERROR.match(line)]
    assert errors[0] == "[rank3]: RuntimeError: planted failure in iteration 2", errors
    causes = re.findall(r"Root Cause \(first observed failure\):\n\[0\]:\n(?:.*\n){2}\s+rank\s+: (\d+)", out)
    assert causes[:1] == ["3"], out[-4000:]                    # torchrun's summary names rank 3 first
    iterations = re.findall(r"iteration\s+(\d+)/\s*50", out)
    assert len(iterations) <= 2, iterations                    # it ended at once, not at iteration 50
    assert left_after(job_id) == {n: [] for n in NODES}


def test_scancel_stops_every_rank_on_both_nodes(cluster):
    job_id = cluster.submit(str(SCRIPT), "--train-iters", "100000")
    deadline = time.monotonic() + JOB_TIMEOUT
    # two ranks on each node (which node is node 0 is the rendezvous' choice)
    while sorted(ranks_on(job_processes(job_id)).values()) != [["0", "1"], ["2", "3"]]:
        assert time.monotonic() < deadline, (cluster.job(job_id), job_processes(job_id))
        assert cluster.job(job_id)["JobState"] in ("PENDING", "CONFIGURING", "RUNNING"), cluster.output(job_id)
        time.sleep(0.5)
    start = time.monotonic()
    cluster.run("scancel", str(job_id))
    while any(job_processes(job_id).values()) and time.monotonic() - start < 60:
        time.sleep(0.2)
    gone = time.monotonic() - start
    assert left_after(job_id) == {n: [] for n in NODES}
    assert cluster.wait(job_id, timeout=60)["JobState"] == "CANCELLED"
    # KillWait=5: SIGTERM, then SIGKILL after 5 s for whatever is left; ranks must not outlive that
    assert gone < 5 + 5, f"processes of job {job_id} lived {gone:.1f} s after scancel"
    print(f"job {job_id}: every process gone {gone:.1f} s after scancel")


def test_experiments_slurm_script_runs(cluster, tmp_path):
    from labkit.experiments.slurm import write_script
    path = write_script("train-tp2-gpt2-large-2gpu", scale="cpu", nodes=2, outdir=tmp_path, steps=2)
    job_id = cluster.submit(str(path))
    info = cluster.wait(job_id)
    out = cluster.output(job_id)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), out[-4000:]
    assert not BAD.search(out), out[-4000:]
    log = (tmp_path / "train-tp2-gpt2-large-2gpu" / "logs.txt").read_text()
    assert len(re.findall(r"^ iteration", log, flags=re.M)) == 2, log
    assert len(re.findall(r"^\[Rank \d\]", log, flags=re.M)) == 2, log     # one memory line per rank
    assert left_after(job_id) == {n: [] for n in NODES}
