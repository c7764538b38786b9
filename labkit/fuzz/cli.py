"""``python -m labkit fuzz``: draw layouts, judge each against one device, shrink and report findings.

    python -m labkit fuzz --seed 0 --layouts 40
    python -m labkit fuzz --seed 0 --minutes 30 --implementation labkit native
    python -m labkit fuzz --seed 0 --layouts 40 --bug cp_grad_scale_one_over_dp   (a planted bug)
    python -m labkit fuzz --replay findings/finding-0-7-grad.json
Exit status: 0 without findings, 1 with findings, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import sys


def main(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="Hypothesis's seed: the same seed, the same layouts")
    budget = ap.add_mutually_exclusive_group()
    budget.add_argument("--layouts", type=int, default=None, help="draw this many layouts (default 40)")
    budget.add_argument("--minutes", type=float, default=None, help="draw until this much time has passed")
    ap.add_argument("--implementation", nargs="+", default=["labkit"], choices=["labkit", "native", "megatron"])
    ap.add_argument("--bug", default=None, help="a planted bug of labkit.debug.BUGS applied to every labkit run")
    ap.add_argument("--steps", type=int, default=2, help="iterations per layout (losses of each are compared)")
    ap.add_argument("--max-world", type=int, default=8)
    ap.add_argument("--out", default="fuzz-findings", help="folder for the reproducers")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--no-diverge", action="store_true")
    ap.add_argument("--stop-at-first", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--replay", default=None, help="run a reproducer file again")
    args = ap.parse_args(argv)
    if args.replay:
        from .run import replay
        o = replay(args.replay)
        print(f"{o.status}: " + "; ".join(f"{p['kind']}: {p['what']} (error {p['error']}, bound {p['bound']})"
                                           for p in o.problems))
        return 1 if o.status == "finding" else 0
    if args.bug is not None:
        from ..debug.bugs import BUGS
        if args.bug not in BUGS:
            print(f"error: --bug must be one of {sorted(BUGS)}", file=sys.stderr)
            return 2
    from .report import summary
    from .run import fuzz
    layouts = args.layouts if args.layouts is not None or args.minutes is not None else 40
    result = fuzz(seed=args.seed, layouts=layouts, minutes=args.minutes, implementations=tuple(args.implementation),
                  bug=args.bug, steps=args.steps, shrink=not args.no_shrink, diverge=not args.no_diverge,
                  stop_at_first=args.stop_at_first, out=args.out, max_world=args.max_world,
                  log=None if args.quiet else lambda line: print(line, flush=True))
    print(summary(result))
    return 1 if result.findings else 0
