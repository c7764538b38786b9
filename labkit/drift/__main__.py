"""``python -m labkit.drift envelopes --out data/envelopes.json [--seeds 0,1,2,3] [--steps 20]
[--families DP,TP+SP] [--precisions fp32,bf16,fp16]`` writes the measured envelopes;
``python -m labkit.drift A B ...`` is ``python -m labkit drift A B ...`` (noise or bug?)."""
from __future__ import annotations

import argparse
import json
import sys


def envelopes_main(argv) -> int:
    from .measure import envelopes
    ap = argparse.ArgumentParser(prog="python -m labkit.drift envelopes")
    ap.add_argument("--out", default="data/envelopes.json")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--families", default=None, help="comma-separated (default: all of FAMILIES)")
    ap.add_argument("--precisions", default="fp32,bf16,fp16",
                    help="names of bounds.PRECISIONS, or a JSON list of labkit.train keyword dicts")
    a = ap.parse_args(argv)
    precisions = json.loads(a.precisions) if a.precisions.startswith("[") else a.precisions.split(",")
    out = envelopes(a.families.split(",") if a.families else None, precisions,
                    [int(s) for s in a.seeds.split(",")], a.steps,
                    command="python -m labkit.drift envelopes " + " ".join(argv),
                    log=lambda s: print(s, flush=True))
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {a.out} ({out['provenance']['seconds']} s)")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["envelopes"]:
        return envelopes_main(argv[1:])
    from .cli import main as drift_main
    return drift_main(argv)


if __name__ == "__main__":
    sys.exit(main())
