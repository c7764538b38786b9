"""``python -m labkit diverge``: the first divergence of a layout from one device, from the shell.

    python -m labkit diverge --world-size 2 --tensor-model-parallel-size 2 --sequence-parallel \
        --inject sp_norm_grads_not_summed
    python -m labkit diverge --list-bugs

Takes ``python -m labkit train``'s flags (Megatron's names) plus ``--inject NAME`` (a planted bug
of ``labkit.debug.BUGS``); float64 and no dropout unless given (the comparison needs them).
"""
from __future__ import annotations

import dataclasses
import sys


def main(argv, train_parser) -> int:
    """``train_parser``: ``labkit.__main__.train_parser`` (passed in: the command line imports us)."""
    from labkit.config import TrainConfig

    from .bugs import BUGS, MODEL
    from .divergence import first_divergence
    ap = train_parser()
    ap.prog, ap.description = "python -m labkit diverge", "Find where a layout first differs from one device."
    ap.add_argument("--inject", default=None, help=f"a planted bug: {', '.join(sorted(BUGS))}")
    ap.add_argument("--list-bugs", action="store_true", help="list the planted bugs and exit")
    ap.set_defaults(steps=1, params_dtype="float64")
    args = vars(ap.parse_args(argv))
    if args["list_bugs"]:
        for name, bug in sorted(BUGS.items()):
            print(f"{name:32s} {bug.doc}  [world {bug.world_size}, {bug.layout or 'dp 2'}]")
        return 0
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    config = {k: v for k, v in args.items() if k in defaults and v != defaults[k]}
    world = args["world_size"] or 1
    try:
        d = first_divergence(world, inject=args["inject"], steps=args["steps"], seed=args["seed"], **config)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(d if d is not None else f"no divergence: {args['steps']} iteration(s) on {world} ranks equal one "
          f"device to float64 round-off")
    return 0


__all__ = ["main", "MODEL"]
