"""``python -m labkit experiments list|run|report`` (labkit/experiments/__init__.py has examples)."""
from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m labkit experiments",
                                 description="The tutorial's experiments: list, run, report.")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every experiment with its model, strategy and batch")
    run = sub.add_parser("run", help="run one experiment with labkit (or print Megatron's command)")
    run.add_argument("id", help="an experiment ID, or a unique prefix of one (302)")
    run.add_argument("--scale", choices=["cpu", "full"], default="full",
                     help="full: the tutorial's size, one GPU per rank; cpu: a small model on gloo ranks")
    run.add_argument("--megatron", action="store_true",
                     help="print the equivalent pretrain_gpt.py command instead of running")
    run.add_argument("--outdir", default="outdir", help="logs go to OUTDIR/<ID>/logs.txt")
    run.add_argument("--train-iters", type=int, default=None, help="default: cpu 4, full 100")
    run.add_argument("--slurm", action="store_true", help="write OUTDIR/<ID>/job.sbatch, an sbatch "
                     "script that runs it on Slurm, instead of running (labkit/experiments/slurm.py)")
    run.add_argument("--nodes", type=int, default=None, help="with --slurm: nodes to spread the ranks over")
    run.add_argument("--verbose", action="store_true", help="on a rank's failure, also its traceback")
    rep = sub.add_parser("report", help="every run beside the tutorial's measurements and labkit.calc")
    rep.add_argument("--outdir", default="outdir")
    rep.add_argument("--runs-only", action="store_true", help="only experiments with a run")
    return ap


def list_lines() -> list[str]:
    from .catalogue import CATALOGUE
    rows = [("ID", "model", "strategy", "GPUs", "mb", "gbs", "seq", "measured (Megatron-LM)")]
    for e in CATALOGUE.values():
        measured = "OOM" if e.oom else f"{e.step_ms:g} ms, {max(e.mem_gib):g} GiB/GPU"
        rows.append((e.id, e.model, e.strategy, str(e.gpus), str(e.micro_batch_size), str(e.global_batch_size),
                     str(e.seq_length), measured))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def main(argv=None) -> int:
    from ..launch_collect import LaunchTimeout, RankFailed
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.command == "list":
            print("\n".join(list_lines()))
        elif args.command == "report":
            from .report import format_table, report
            print(format_table(report(args.outdir, only_runs=args.runs_only)))
        elif args.slurm:
            from .slurm import main as slurm_main
            return slurm_main(args.id, args.scale, args.nodes, args.outdir, args.train_iters)
        elif args.megatron:
            from .catalogue import get
            from .runner import megatron_command
            print(megatron_command(get(args.id), args.scale, args.train_iters))
        else:
            from .runner import run
            run(args.id, args.scale, args.outdir, args.train_iters)
    except ValueError as err:   # an unknown ID, a refused layout, too few GPUs: say so, no traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (RankFailed, LaunchTimeout) as err:   # one line; the whole story under --verbose
        print(f"error: {err.summary if isinstance(err, RankFailed) else str(err).splitlines()[0]}",
              file=sys.stderr)
        if getattr(args, "verbose", False):
            print(err.details() if isinstance(err, RankFailed) else str(err), file=sys.stderr)
        return 1
    return 0
