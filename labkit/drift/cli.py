"""``python -m labkit drift A B``: is the gap between two runs noise or a bug?

    python -m labkit drift tp2.log tp1.log --layout-a tp=2,sp --layout-b 1 --precision bf16
    python -m labkit drift run_a.json run_b.json --layout-a dp=2,zero=1 --precision fp32

A and B: Megatron (or labkit) training logs, or labkit runs as JSON (a list of losses, or
{"losses": [...], "grad_norms": [...]}). B is the baseline (the one-device run, or the layout you
trust); the drift of each step is measured relative to it. Layouts: ``labkit.drift.layouts.parse_layout``.
Exit status: 0 within the envelope (noise), 1 outside (look for a bug), 2 a usage error.
"""
from __future__ import annotations

import argparse
import json
import sys


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m labkit drift",
                                 description="Within the measured envelope of a correct run (noise), or "
                                             "outside it and from which iteration (a bug)?")
    ap.add_argument("a", help="run A: a Megatron/labkit log, or a labkit run as JSON")
    ap.add_argument("b", help="run B, the baseline (same formats)")
    ap.add_argument("--layout-a", default="1", help='A\'s layout, e.g. "tp=2,sp" or "dp=2,zero=1" (default: 1 device)')
    ap.add_argument("--layout-b", default="1", help="B's layout (default: 1 device)")
    ap.add_argument("--precision", default="bf16", help="the runs' precision, as the envelopes name it "
                                                        "(fp32, bf16, fp16; default bf16)")
    ap.add_argument("--envelopes", default=None, help="envelopes JSON (default: data/envelopes.json of labkit's tree)")
    ap.add_argument("--json", action="store_true", help="print the verdict as JSON")
    return ap


def default_envelopes() -> str:
    import os
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "data", "envelopes.json")


def main(argv=None) -> int:
    from .decide import decide, load_envelopes, read_series
    from .layouts import family_of, parse_layout
    args = parser().parse_args(argv)
    try:
        family = family_of(parse_layout(args.layout_a), parse_layout(args.layout_b))
        verdict = decide(read_series(args.a), read_series(args.b), family, args.precision,
                         load_envelopes(args.envelopes or default_envelopes()))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(verdict.__dict__) if args.json else verdict.text())
    return 0 if verdict.within else 1


if __name__ == "__main__":
    sys.exit(main())
