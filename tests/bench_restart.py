"""Benchmark: kill ranks, restart, resume bit-identical; goodput measured against labkit.calc.goodput.

    PYTHONPATH=. python tests/bench_restart.py [--out data/restart_bench.json] [--only layouts,long,sweep]

Issue 37 (chapter "When training goes wrong", section "Ranks that die"). Three parts, on gloo ranks:

* ``layouts``: the layouts tests/test_restart.py does not run (per-layer ZeRO-3, EP, bf16 with the
  distributed optimizer, each with dropout and several microbatches) and a hang (a collective
  timeout), each with two faults; final weights, optimizer states, step, RNG (torch.equal on the
  reassembled final checkpoint), losses and gradient norms against the run that never failed.
* ``long``: 100 iterations of TP2 x PP2 x DP2 with ZeRO-1 and dropout, 5 faults at random
  iterations and ranks (seeded): SIGKILL, SIGTERM, an exception, a kill during a save.
* ``sweep``: the same 5 faults on DDP (2 ranks), for several save intervals: measured goodput and its
  losses by cause, against ``labkit.calc.goodput`` fed the run's own step time, save blocking, restart
  cost and MTBF; the best measured interval against Young's and Daly's.

Writes one JSON file (default data/restart_bench.json); the chapter's figure reads it.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LABKIT_BACKEND", "gloo")

import labkit  # noqa: E402
from labkit.restart import Fault, predicted, same_state, saved_state  # noqa: E402

SMALL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16,
             make_vocab_size_divisible_by=64, hidden_dropout=0.1, attention_dropout=0.1)
LAYOUTS = {
    "zero3 per layer, dp4": (4, dict(SMALL, zero_stage=3, micro_batch_size=1, global_batch_size=8)),
    "moe ep2, dp2": (2, dict(SMALL, num_experts=4, moe_router_topk=2, expert_model_parallel_size=2,
                             micro_batch_size=1, global_batch_size=4)),
    "bf16 distributed optimizer, dp4": (4, dict(SMALL, bf16=True, use_distributed_optimizer=True,
                                                micro_batch_size=1, global_batch_size=8)),
}
TPPPDP = (8, dict(SMALL, tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                  use_distributed_optimizer=True, micro_batch_size=1, global_batch_size=4))
DDP2 = (2, dict(SMALL, micro_batch_size=2, global_batch_size=8))


def compare(world, config, steps, interval, faults, root: Path, **kw) -> dict:
    """Run uninterrupted and with ``faults``; say what is bit-identical and where the time went."""
    t0 = time.time()
    whole = labkit.train(world_size=world, steps=steps, log_interval=0, save=root / "whole", **config, **kw)
    t1 = time.time()
    hit = labkit.train(world_size=world, steps=steps, log_interval=0, save=root / "hit", save_interval=interval,
                       max_restarts=len(faults), faults=faults, **config, **kw)
    t2 = time.time()
    diff = same_state(saved_state(root / "whole"), saved_state(root / "hit"))
    return {"world_size": world, "steps": steps, "save_interval": interval,
            "faults": [f.name for f in faults], "events": hit.restarts,
            "losses_equal": hit.losses == whole.losses, "grad_norms_equal": hit.grad_norms == whole.grad_norms,
            "state_equal": not diff, "state_diff": diff[:10],
            "recomputed_losses_equal": hit.goodput["recomputed_losses_equal"],
            "wall_uninterrupted_s": t1 - t0, "wall_with_faults_s": t2 - t1,
            "goodput": hit.goodput, "model": predicted(hit.goodput, interval)}


def random_faults(rng, world, steps, interval, n=5) -> list[Fault]:
    """n faults at distinct random iterations and ranks: SIGKILL x2, SIGTERM, an exception, and a
    SIGKILL during a save (at a checkpoint iteration)."""
    its = sorted(rng.sample(range(1, steps), n - 1))
    hows = ["SIGKILL", "SIGTERM", "exception", "SIGKILL"]
    rng.shuffle(hows)
    out = [Fault(rng.randrange(world), it, "step", how) for it, how in zip(its, hows)]
    saves = [k for k in range(interval, steps, interval) if k not in its]
    out.append(Fault(rng.randrange(world), rng.choice(saves), "save", "SIGKILL"))
    return sorted(out, key=lambda f: (f.iteration, f.at == "step"))


def layouts(root: Path) -> dict:
    out = {}
    for name, (world, config) in LAYOUTS.items():
        faults = [Fault(world - 1, 4, "save"), Fault(0, 5, "step", "SIGTERM")]
        out[name] = compare(world, config, 6, 2, faults, root / name.replace(" ", "_"))
        print(name, {k: out[name][k] for k in ("losses_equal", "state_equal", "wall_with_faults_s")}, flush=True)
    world, config = DDP2
    out["ddp2, a hang (collective timeout)"] = compare(world, config, 6, 2, [Fault(1, 3, "step", "hang")],
                                                       root / "hang", collective_timeout=10.0)
    return out


def long_run(root: Path, steps: int = 100, interval: int = 10) -> dict:
    world, config = TPPPDP
    faults = random_faults(random.Random(37), world, steps, interval)
    out = compare(world, config, steps, interval, faults, root / "long")
    print("long", {k: out[k] for k in ("losses_equal", "state_equal", "wall_with_faults_s")}, flush=True)
    return out


def sweep(root: Path, steps: int = 100, intervals=(2, 5, 10, 25)) -> dict:
    world, config = DDP2
    rows = []
    for k in intervals:
        faults = random_faults(random.Random(7), world, steps, k)
        hit = labkit.train(world_size=world, steps=steps, log_interval=0, save=root / f"sweep{k}",
                           save_interval=k, max_restarts=len(faults), faults=faults, **config)
        rows.append({"save_interval": k, "faults": [f.name for f in faults], "measured": hit.goodput,
                     "model": predicted(hit.goodput, k)})
        g = hit.goodput
        print(f"interval {k}: goodput {g['goodput']:.3f} (after start-up {g['goodput_after_startup']:.3f}), "
              f"model {rows[-1]['model']['goodput']:.3f}", flush=True)
    best = max(rows, key=lambda r: r["measured"]["goodput_after_startup"])
    step = sum(r["measured"]["step_s"] for r in rows) / len(rows)
    return {"world_size": world, "steps": steps, "rows": rows, "best_interval": best["save_interval"],
            "mean_step_s": step, "young_iterations": [r["model"]["young_s"] / step for r in rows],
            "daly_iterations": [r["model"]["daly_s"] / step for r in rows]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data" / "restart_bench.json"))
    ap.add_argument("--only", default="layouts,long,sweep")
    args = ap.parse_args(argv)
    parts = {"layouts": layouts, "long": long_run, "sweep": sweep}
    out = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            t0 = time.time()
            out[name] = parts[name](Path(tmp) / name)
            out[name + "_bench_s"] = time.time() - t0
            out["machine"] = {"cpus": os.cpu_count(), "load": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d")}
            Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
