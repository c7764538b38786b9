"""The Slurm scripts without a cluster: one shared launch, valid bash, and the scripts
``experiments run ID --slurm`` writes (tests/test_slurm.py submits them to a real cluster)."""
import re
import shutil
import subprocess

import pytest

from labkit.experiments import slurm
from labkit.experiments.cli import main as experiments_cli
from test_slurm import RECORD, ROOT, check_clean_run, check_failed_run, local_cluster, script_config

EXAMPLES = ROOT / "examples" / "slurm"
SBATCH = sorted(EXAMPLES.glob("*.sbatch"))


def test_every_script_is_valid_bash():
    for path in [*SBATCH, EXAMPLES / "launch.sh"]:
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, (path, done.stderr)


def test_the_gpu_and_cpu_scripts_share_one_launch():
    assert [p.name for p in SBATCH] == ["train_2x8.sbatch", "train_cpu.sbatch"]
    for path in SBATCH:
        text = path.read_text()
        body = [re.sub(r"(^|\s)#.*", "", ln) for ln in text.splitlines()]   # code, not comments
        assert "exec bash examples/slurm/launch.sh" in text
        # the launch itself (srun, torchrun, the rendezvous) is written once, in launch.sh
        assert not any(re.search(r"\b(srun|torchrun|rdzv|MASTER_ADDR)\b", ln) for ln in body), path
        assert text.rstrip().endswith('"$@"')                   # extra flags reach labkit train
    launch = (EXAMPLES / "launch.sh").read_text()
    for needed in ("srun --kill-on-bad-exit=1 torchrun", "--rdzv-backend c10d", '--rdzv-id "$SLURM_JOB_ID"',
                   "--rdzv-conf is_host=false", "rendezvous_store.py"):
        assert needed in launch


def test_train_cpu_sbatch_is_the_two_agent_layout():
    world, args = script_config()
    assert world == 4
    assert (args["tensor_model_parallel_size"], args["micro_batch_size"], args["global_batch_size"],
            args["params_dtype"], args["backend"]) == (2, 2, 8, "float64", "gloo")


def test_cpu_script_for_an_experiment():
    text = slurm.script_text("train-tp2-gpt2-large-2gpu", scale="cpu", nodes=2, outdir="out", steps=2)
    assert "#SBATCH --nodes=2" in text and "--gpus-per-node" not in text
    assert ("exec bash examples/slurm/launch.sh 1 \\\n    -m labkit experiments run train-tp2-gpt2-large-2gpu "
            "--scale cpu \\\n    --outdir out --train-iters 2 \"$@\"") in text
    assert "#SBATCH --output=out/train-tp2-gpt2-large-2gpu/slurm-%j.out" in text


def test_gpu_script_for_an_experiment():
    text = slurm.script_text("302", scale="full")
    assert "#SBATCH --nodes=1" in text and "#SBATCH --gpus-per-node=2" in text
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in text                      # CP 2: Megatron's setting
    assert "launch.sh 2 \\\n    -m labkit experiments run 302-cp2-gpt2xl-gbs4-len4096 --scale full" in text
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in slurm.script_text("train-dp2-gpt2-large-2gpu")


@pytest.mark.parametrize("nodes, words", [(3, "3 node(s) do not divide 2"), (0, "do not divide"),
                                          (2, None)])
def test_nodes_must_split_the_ranks(nodes, words):
    if words is None:
        assert slurm.layout("train-tp2-gpt2-large-2gpu", "cpu", nodes) == (2, 1)
        return
    with pytest.raises(ValueError, match=re.escape(words)):
        slurm.layout("train-tp2-gpt2-large-2gpu", "cpu", nodes)


def test_cli_writes_the_script(tmp_path, capsys):
    assert experiments_cli(["run", "train-sp2", "--scale", "cpu", "--slurm", "--nodes", "2",
                            "--outdir", str(tmp_path)]) == 0
    path = tmp_path / "train-sp2-gpt2-large-2gpu" / "job.sbatch"
    assert f"wrote {path}" in capsys.readouterr().out
    assert path.read_text() == slurm.script_text("train-sp2-gpt2-large-2gpu", "cpu", 2, tmp_path)
    assert experiments_cli(["run", "train-sp2", "--slurm", "--nodes", "3", "--outdir", str(tmp_path)]) == 2
    assert "nodes: train-sp2-gpt2-large-2gpu runs 2 rank(s)" in capsys.readouterr().err
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_the_recorded_runs_the_chapter_shows_are_current():
    """examples/slurm/train_cpu.record.json (``local_cluster.py --record``): the clean run logged
    labkit.reference's losses and left nothing; the failing run named rank 3 first."""
    import json
    record = json.loads(RECORD.read_text())
    check_clean_run(record["ok"])
    check_failed_run(record["failing_rank"])
    for run in (record["ok"], record["failing_rank"]):
        assert run["left"] == {"n1": [], "n2": []}
    assert sorted(local_cluster.ranks(record["ok"]["processes"]).values()) == [[0, 1], [2, 3]]


def test_a_failing_rank_under_torchrun_ends_the_run(tmp_path):
    """What srun --kill-on-bad-exit relies on, without Slurm: under torchrun, a rank whose
    function raised leaves at once (labkit's exit barrier would wait for ranks blocked waiting for
    it, until the collective timeout), so its agent stops the other ranks and names it."""
    import os
    import sys
    from pathlib import Path
    world, args = script_config()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(local_cluster.PLANTS["failing-rank"]), os.environ.get("PYTHONPATH", str(ROOT))])}
    flags = ["--backend", "gloo", "--tensor-model-parallel-size", "2", "--micro-batch-size", "2",
             "--global-batch-size", "8", "--train-iters", "50", "--data-path", args["data_path"]]
    env["LABKIT_TEST_RUN"] = str(tmp_path)        # marks every process of this run, for the cleanup
    try:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", str(world), "-m", "labkit", "train", *flags],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200)
    finally:   # a hung run leaves its ranks behind the killed agent (torchrun's own sessions)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if f"LABKIT_TEST_RUN={tmp_path}".encode() in Path("/proc", pid, "environ").read_bytes():
                    os.kill(int(pid), 9)
            except OSError:
                pass
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "[rank3]: RuntimeError: planted failure in iteration 2" in out, out[-3000:]
    assert re.search(r"Root Cause \(first observed failure\):\n\[0\]:\n(?:.*\n){2}\s+rank\s+: 3", out), out[-3000:]
