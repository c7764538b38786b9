"""Run a catalogued experiment with labkit, or print the Megatron-LM command that runs it.

    run("train-tp2-gpt2-large-2gpu", scale="cpu")   # 2 gloo ranks, writes outdir/<ID>/logs.txt
    megatron_command(get("302"))                      # torchrun ... pretrain_gpt.py --context-parallel-size 2 ...

``logs.txt`` holds what a Megatron run's log holds for these runs: the iteration lines
(``labkit.training.format_iteration``, Megatron's ``training_log`` format, streamed by
``labkit.train``) and one memory report per rank in Megatron's ``report_memory`` format
(``[Rank r] (after N iterations) memory (MB) | ...``). On CPU ranks the memory line carries what
labkit holds per rank (parameters, gradients, optimizer states: ``params``, ``grads``,
``optimizer states``); on GPUs under torchrun it starts with Megatron's four CUDA-allocator fields.
Both are read back by ``labkit.megatron_bridge.parse_log(text, memory=True)``. Beside it,
``run.json`` keeps the configuration, for ``experiments report``.

Full scale runs one rank per GPU (NCCL): under ``torchrun`` (one process per GPU, any number of
nodes), or spawned by ``labkit.launch`` on one node. It was not run on a GPU for this course yet
(the course's machines have none); ``--scale cpu`` is what the tests run.
"""
from __future__ import annotations

import io
import json
import os
import shlex
import sys
from contextlib import redirect_stdout
from pathlib import Path

from .catalogue import Experiment, get

SEED = 1234              # Megatron's default --seed (it must be > 0 there); seeds init and data
STEPS = {"cpu": 4, "full": 100}   # the tutorial's runs "stop after 100 training steps" (the CP table)
MB = 1024 * 1024


class _Tee(io.TextIOBase):
    """Write to the terminal and keep a copy (the lines labkit.train streams)."""

    def __init__(self, out):
        self.out, self.kept = out, io.StringIO()

    def write(self, text):
        self.out.write(text)
        self.kept.write(text)
        return len(text)

    def flush(self):
        self.out.flush()


def memory_lines(result, steps: int, cuda: list | None = None) -> list[str]:
    """One ``report_memory`` line per rank (Megatron's format, ``utils/common_utils.py`` @ d98e8a64).

    ``cuda``: per rank (allocated, max allocated, reserved, max reserved) bytes, when on GPUs."""
    lines = []
    for rank, extra in enumerate(result.ranks):
        fields = []
        if cuda is not None:
            names = ("allocated", "max allocated", "reserved", "max reserved")
            fields += [f"{n}: {v / MB:.2f}" for n, v in zip(names, cuda[rank])]
        held = extra.get("memory") or {}
        fields += [f"{n}: {held[k] / MB:.2f}" for k, n in (("params", "params"), ("grads", "grads"),
                                                           ("optimizer", "optimizer states")) if k in held]
        lines.append(f"[Rank {rank}] (after {steps} iterations) memory (MB) | " + " | ".join(fields))
    return lines


def _cuda_memory() -> list | None:
    """Under torchrun with NCCL: every rank's allocator statistics, gathered (else None)."""
    import torch
    import torch.distributed as dist
    if not (dist.is_initialized() and "nccl" in str(dist.get_backend()) and torch.cuda.is_available()):
        return None
    mine = (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(),
            torch.cuda.memory_reserved(), torch.cuda.max_memory_reserved())
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out


def _backend(e: Experiment, scale: str) -> str:
    """gloo at cpu scale; at full scale one GPU per rank (torchrun decides the rest itself)."""
    if scale == "cpu":
        return "gloo"
    from ..launcher import gpu_count, under_torchrun
    if under_torchrun():
        if int(os.environ["WORLD_SIZE"]) != e.gpus:
            raise ValueError(f"{e.id} runs on {e.gpus} GPUs; this torchrun has WORLD_SIZE "
                             f"{os.environ['WORLD_SIZE']}")
        return "auto"
    if gpu_count() < e.gpus:
        raise ValueError(f"{e.id} at full scale needs {e.gpus} GPU(s), one per rank; found "
                         f"{gpu_count()}. Run it with --scale cpu (gloo ranks, a small model), or "
                         f"print the Megatron-LM command with --megatron")
    return "nccl"


def _check_writable(folder: Path) -> None:
    """Create ``folder`` and write a file in it, or a ValueError naming it (a run's logs must not be
    lost to an output folder that refuses them only once the training is done)."""
    import tempfile
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ValueError(f"outdir: cannot write the logs to {folder}: {err.strerror or err}") from None


def run(experiment_id: str, scale: str = "cpu", outdir="outdir", steps: int | None = None,
        seed: int = SEED, timeout: float = 600.0, **overrides) -> dict:
    """Train experiment ``experiment_id`` with labkit at ``scale`` and write ``outdir/<ID>/logs.txt``.

    ``overrides``: TrainConfig fields to change (e.g. ``params_dtype="float64"``). Returns
    {"path", "result" (labkit.training.TrainResult), "config"}."""
    from ..megatron_bridge import parse_line
    from ..training import train
    e = get(experiment_id)
    path = Path(outdir) / e.id / "logs.txt"
    if int(os.environ.get("RANK", 0)) == 0:
        _check_writable(path.parent)            # before the training, not after it
    config = {**e.train_config(scale), **overrides}
    steps = STEPS[scale] if steps is None else steps
    backend = _backend(e, scale)
    tee = _Tee(sys.stdout)
    with redirect_stdout(tee):   # labkit.train prints rank 0's iteration lines as they come
        result = train(world_size=e.gpus, steps=steps, seed=seed, backend=backend, timeout=timeout,
                       **config)
    iteration_lines = [ln for ln in tee.kept.getvalue().splitlines() if parse_line(ln) is not None]
    memory = memory_lines(result, steps, _cuda_memory() if scale == "full" else None)
    header = (f"# labkit experiments run {e.id} --scale {scale}: {e.strategy} on {e.gpus} rank(s), "
              f"seed {seed}, " + " ".join(f"{k}={v}" for k, v in config.items() if k != "data_path"))
    if int(os.environ.get("RANK", 0)) == 0:
        path.write_text("\n".join([header, *iteration_lines, *memory]) + "\n")
        meta = {"id": e.id, "scale": scale, "world_size": e.gpus, "steps": steps, "seed": seed,
                "config": config}     # what `experiments report` needs to predict this run
        (path.parent / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
        for line in memory:
            print(line)
        print(f"wrote {path}")
    return {"path": path, "result": result, "config": config}


def megatron_command(e: Experiment, scale: str = "full", steps: int | None = None,
                     seed: int = SEED, data_path: str | None = None) -> str:
    """The ``pretrain_gpt.py`` command of the same run (flags from ``megatron_bridge.to_flags``,
    every flag checked against Megatron's list, ``labkit.calc.megatron_flags`` @ d98e8a64)."""
    from ..calc.megatron_args import FLAGS
    from ..config import TrainConfig
    from ..megatron_bridge import to_flags
    if data_path is None:   # the shipped file, as the reader's shell sees it from here
        data_path = os.path.relpath(e.train_config(scale)["data_path"])
    cfg = TrainConfig(**{**e.train_config(scale), "data_path": data_path})
    steps = STEPS[scale] if steps is None else steps
    flags = to_flags(cfg, steps, seed)   # + --split 100,0,0 --seed: the same samples, same order
    # the byte vocabulary of the data file: NullTokenizer with 256 ids (d98e8a64: its vocab_size is
    # the argument; EOD is 255, a byte the ASCII corpus never holds)
    flags += ["--tokenizer-type", "NullTokenizer", "--vocab-size", "256", "--log-interval", "1",
              "--eval-iters", "0"]
    unknown = [f for f in flags if f.startswith("--") and f[2:] not in FLAGS]
    if unknown:
        raise ValueError(f"not Megatron-LM flags (arguments.py @ d98e8a64): {unknown}")
    env = "CUDA_DEVICE_MAX_CONNECTIONS=1 " if e.tp > 1 or e.cp > 1 else ""
    pairs, i = [], 0
    while i < len(flags):   # one flag (and its value) per line
        has_value = i + 1 < len(flags) and not flags[i + 1].startswith("--")
        pairs.append(" ".join(shlex.quote(x) for x in flags[i:i + 1 + has_value]))
        i += 1 + has_value
    lines = [f"# {e.id}: {e.strategy}, {e.model} on {e.gpus} GPU(s); the tutorial ran it on {e.hardware}",
             "# labkit's run in Megatron's flags: fp32, dropout 0, the byte-level data file; the",
             "# tutorial's own run used 16-bit weights and GPT-2 BPE data (--vocab-file, --merge-file)",
             f"{env}torchrun --nproc-per-node {e.gpus} pretrain_gpt.py \\"]
    lines += [f"    {p} \\" for p in pairs[:-1]] + [f"    {pairs[-1]}"]
    return "\n".join(lines)
