"""A two-node Slurm cluster on one machine: try the course's sbatch scripts without a cluster.

    sudo python examples/slurm/local_cluster.py examples/slurm/train_cpu.sbatch   # start, submit, wait, stop
    sudo python examples/slurm/local_cluster.py --plant failing-rank examples/slurm/train_cpu.sbatch
    sudo python examples/slurm/local_cluster.py --record examples/slurm/train_cpu.record.json

Linux, root (slurmd starts job steps as the job's user) and Debian's slurm-wlm (22.05:
``apt-get install slurm-wlm``). In a temporary folder it starts one ``slurmctld`` and two
``slurmd -N n1|n2``: ``AuthType=auth/none`` and ``CredType=cred/none`` (no munge key to share),
every daemon on 127.0.0.1 at a free port of its own, its own state and spool folders; all of it is
stopped and removed at the end. The node names need no name service: ``NodeAddr=127.0.0.1`` says
where each node is (``launch.sh`` reads ``NodeAddr``). CPUs are allocated one by one
(``select/cons_tres``, ``CR_CPU``) and bound (``TaskPlugin=task/affinity``), as on a GPU cluster, so
the CPUs a rank may run on are Slurm's choice (the tests read them). Process tracking is ``proctrack/linuxproc``:
Slurm finds a step's processes by walking /proc from the step's first process (torchrun starts its
ranks in sessions of their own, which ``proctrack/pgid`` would miss; cgroups are often unavailable
in containers). tests/test_slurm.py runs the course's job on it; ``--record`` writes the runs the
chapter "From labkit to Megatron-LM" shows (section "Many nodes").
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NODES = ("n1", "n2")
KILL_WAIT = 5            # s between Slurm's SIGTERM and SIGKILL when a step ends or is cancelled
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
        "BOOT_FAIL", "DEADLINE")
# what each process of a job was told, for the chapter's table
SHOWN = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_NODEID", "SLURM_PROCID",
         "SLURM_LOCALID", "SLURMD_NODENAME", "SLURM_STEP_ID", "SLURM_CPUS_PER_TASK", "RANK",
         "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS")

# adverse cases, planted in a job: a folder with a sitecustomize.py every Python process of the job
# loads first (PYTHONPATH)
PLANTS = {p.name.replace("_", "-"): p for p in sorted((Path(__file__).parent / "plants").iterdir())
          if (p / "sitecustomize.py").exists()}


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def slurm_conf(folder: Path, ctld: int, slurmd: list[int]) -> str:
    nodes = "\n".join(f"NodeName={n} NodeAddr=127.0.0.1 Port={p} CPUs=2 State=UNKNOWN"
                      for n, p in zip(NODES, slurmd))
    return f"""ClusterName=labkit-local
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd[0]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait={KILL_WAIT}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=60 State=UP
"""


def unavailable() -> str | None:
    """Why a local cluster cannot start here (None: it can try)."""
    missing = [c for c in ("slurmctld", "slurmd", "sbatch", "scontrol", "srun") if not shutil.which(c)]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} not found; Debian: apt-get install "
                f"slurm-wlm)")
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root (slurmd starts job steps as the job's user)"
    return None


class Cluster:
    """``with Cluster() as c: job = c.submit(script); c.wait(job)``: the two-node cluster."""

    def __init__(self, folder: str | Path | None = None):
        self._made = folder is None
        self.dir = Path(tempfile.mkdtemp(prefix="labkit-slurm-") if folder is None else folder)
        self.daemons: list[subprocess.Popen] = []
        (self.dir / "state").mkdir(parents=True, exist_ok=True)
        for n in NODES:
            (self.dir / "spool" / n).mkdir(parents=True, exist_ok=True)
        ctld, *slurmd = free_ports(1 + len(NODES))
        self.conf = self.dir / "slurm.conf"
        self.conf.write_text(slurm_conf(self.dir, ctld, slurmd))
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self, timeout: float = 60) -> None:
        """Start the daemons (in the foreground, our children) and wait for both nodes idle."""
        cmds = [["slurmctld", "-D", "-i", "-f", str(self.conf)]]
        cmds += [["slurmd", "-D", "-N", n, "-f", str(self.conf)] for n in NODES]
        for cmd in cmds:
            name = cmd[3] if cmd[0] == "slurmd" else "ctld"
            with open(self.dir / f"{cmd[0]}-{name}.stderr", "w") as log:
                self.daemons.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=log))
        deadline, states = time.monotonic() + timeout, []
        while time.monotonic() < deadline:
            states = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout.split()
            if states == [w for n in NODES for w in (n, "idle")]:
                return
            if any(p.poll() is not None for p in self.daemons):
                break
            time.sleep(0.5)
        logs = "\n".join(f"{f.name}: {f.read_text()[-1500:]}" for f in sorted(self.dir.glob("*.log")))
        self.stop()
        raise RuntimeError(f"the two-node cluster did not come up (sinfo: {states}):\n{logs}")

    def stop(self) -> None:
        """Cancel what runs, wait for it to end, stop the daemons (the slurmd first)."""
        if self.daemons and self.daemons[0].poll() is None:
            self.run("scancel", "--partition=debug", check=False)
            deadline = time.monotonic() + 30
            while self.run("squeue", "-h", check=False).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.5)
        for p in reversed(self.daemons):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.daemons = []
        if self._made:
            shutil.rmtree(self.dir, ignore_errors=True)

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60, check=check)

    def submit(self, script: str | Path, *args: str, plant: str | None = None,
               time_limit_min: int = 5, env: dict | None = None) -> int:
        """``sbatch script args`` from the repository root; its output goes to this cluster's folder.
        ``plant``: a key of PLANTS (examples/slurm/plants/), loaded by every Python process of the job;
        ``env``: more variables for the job (sbatch exports the caller's environment)."""
        env = dict(self.env, **(env or {}))
        if plant is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PLANTS[plant]), env.get("PYTHONPATH")) if p)
        out = subprocess.run(["sbatch", "--parsable", f"--time={time_limit_min}",
                              f"--output={self.dir}/%x-%j.out", str(script), *args],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
        return int(out.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict:
        line = self.run("scontrol", "show", "job", "-o", str(job_id)).stdout
        return dict(f.split("=", 1) for f in line.split() if "=" in f)

    def wait(self, job_id: int, timeout: float = 300) -> dict:
        """Wait for the job to end (then its ``scontrol show job`` fields); cancel it at ``timeout``."""
        deadline, info = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info["JobState"] in DONE:
                return info
            time.sleep(0.5)
        self.run("scancel", str(job_id), check=False)
        raise TimeoutError(f"job {job_id} still {info.get('JobState')} after {timeout} s:\n"
                           f"{self.output(job_id)[-3000:]}")

    def output(self, job_id: int) -> str:
        paths = list(self.dir.glob(f"*-{job_id}.out"))
        return paths[0].read_text() if paths else ""


def _read(pid: str) -> tuple[str, str, dict, list[str]] | None:
    """(parent pid, command line, environment, slurmd log files held open, CPUs it may run on)."""
    try:
        proc = Path("/proc", pid)
        cmd = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        env = dict(kv.split("=", 1) for kv in proc.joinpath("environ").read_bytes().decode(
            errors="replace").split("\0") if "=" in kv)
        ppid = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1]
        logs = [os.readlink(f) for f in proc.joinpath("fd").iterdir()] if cmd.startswith("slurmstepd") else []
        cpus = sorted(os.sched_getaffinity(int(pid)))   # the CPUs it may run on (task/affinity binds)
    except (OSError, ValueError):
        return None                          # gone while we looked
    return ppid, cmd, env, [f for f in logs if "slurmd-" in f], cpus


def job_processes(job_id: int) -> dict[str, list[dict]]:
    """Every live process of ``job_id``, by node: the job's slurmstepd on each node (its title is
    ``slurmstepd: [ID.step]``; its node, the node's log file it holds open) and every process below
    it, and every process whose environment carries the job's id (found even if it left its tree)."""
    procs = {pid: p for pid in os.listdir("/proc") if pid.isdigit() and (p := _read(pid))}
    title = f"slurmstepd: [{job_id}."
    found = {n: [] for n in NODES}
    for pid, (ppid, cmd, env, logs, cpus) in procs.items():
        if cmd.startswith(title):
            node = next((n for n in NODES for f in logs if f.endswith(f"slurmd-{n}.log")), "?")
        elif env.get("SLURM_JOB_ID") == str(job_id):
            node = env.get("SLURMD_NODENAME", "?")
        else:
            up = ppid                         # below a slurmstepd of the job?
            while up in procs and not procs[up][1].startswith(title):
                up = procs[up][0]
            if up not in procs:
                continue
            node = "?"
        found.setdefault(node, []).append(
            {"pid": int(pid), "ppid": int(ppid), "cmd": cmd, "env": {k: env[k] for k in SHOWN if k in env},
             "cpus": cpus})
    return found


def left_after(job_id: int, grace: float = 2 * KILL_WAIT) -> dict[str, list[dict]]:
    """What is left of an ended job once Slurm has cleaned up (a job reads COMPLETED when its batch
    script exits; the step daemons then end what remains: SIGTERM, SIGKILL after KillWait)."""
    deadline = time.monotonic() + grace
    while any((found := job_processes(job_id)).values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def ranks(found: dict[str, list[dict]]) -> dict[str, list[int]]:
    """The training ranks (torchrun's workers: RANK in their environment) on each node."""
    return {n: sorted(int(p["env"]["RANK"]) for p in ps if "RANK" in p["env"]) for n, ps in found.items()}


def run_and_watch(cluster: Cluster, script, *args, plant=None, world: int = 4, env=None) -> dict:
    """Submit, snapshot the job's processes while every rank is up, wait; the run as a record."""
    start = time.monotonic()
    job_id = cluster.submit(script, *args, plant=plant, env=env)
    seen: dict = {}
    while True:
        info = cluster.job(job_id)
        found = job_processes(job_id)
        if sum(map(len, ranks(found).values())) == world and not seen:
            seen = found
        if info["JobState"] in DONE:
            break
        if time.monotonic() - start > 300:
            cluster.wait(job_id, timeout=0)  # cancels, raises
        time.sleep(0.2)
    wall = time.monotonic() - start
    return {"job_id": job_id, "state": info["JobState"], "exit_code": info["ExitCode"],
            "wall_s": round(wall, 1), "output": cluster.output(job_id), "processes": seen,
            "left": left_after(job_id)}


def record(path: Path) -> dict:
    """The runs the chapter shows: train_cpu.sbatch clean, then with rank 3 failing."""
    import torch
    script = ROOT / "examples" / "slurm" / "train_cpu.sbatch"
    with Cluster() as c:
        version = c.run("sinfo", "--version").stdout.strip()
        ok = run_and_watch(c, script)
        failed = run_and_watch(c, script, "--train-iters", "50", plant="failing-rank")
    rec = {"recorded": time.strftime("%Y-%m-%d"), "slurm": version, "torch": torch.__version__,
           "script": "examples/slurm/train_cpu.sbatch", "ok": ok, "failing_rank": failed}
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("script", nargs="?", help="an sbatch script to submit (from the repository root)")
    ap.add_argument("args", nargs="*", help="its arguments")
    ap.add_argument("--plant", choices=sorted(PLANTS), help="an adverse case, planted in the job")
    ap.add_argument("--record", type=Path, help="write the chapter's runs to this JSON file")
    a = ap.parse_args(argv)
    why = unavailable()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    if a.record:
        rec = record(a.record)
        print(f"wrote {a.record}: {rec['ok']['state']} in {rec['ok']['wall_s']} s; "
              f"failing rank: {rec['failing_rank']['state']}")
        return 0
    if not a.script:
        ap.error("give an sbatch script, or --record")
    with Cluster() as c:
        job_id = c.submit(a.script, *a.args, plant=a.plant)
        print(f"submitted job {job_id} to the two-node cluster in {c.dir}", flush=True)
        info = c.wait(job_id)
        print(c.output(job_id), end="")
        print(f"job {job_id}: {info['JobState']}, exit code {info['ExitCode']}, run time {info['RunTime']}")
        return 0 if info["JobState"] == "COMPLETED" else 1


if __name__ == "__main__":
    sys.exit(main())
