"""``python -m labkit.drift envelopes --out data/envelopes.json [--seeds 0,1,2] [--steps 20]
[--families DP,TP+SP] [--precisions fp32,bf16,fp16]`` writes the measured envelopes (after each
cell); ``python -m labkit.drift merge PART.json ... --out data/envelopes.json`` joins parts;
``python -m labkit.drift A B ...`` is ``python -m labkit drift A B ...`` (noise or bug?)."""
from __future__ import annotations

import argparse
import json
import sys


def envelopes_main(argv) -> int:
    from .measure import envelopes
    ap = argparse.ArgumentParser(prog="python -m labkit.drift envelopes")
    ap.add_argument("--out", default="data/envelopes.json")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--families", default=None, help="comma-separated (default: all of FAMILIES)")
    ap.add_argument("--precisions", default="fp32,bf16,fp16",
                    help="names of bounds.PRECISIONS, or a JSON list of labkit.train keyword dicts")
    a = ap.parse_args(argv)
    precisions = json.loads(a.precisions) if a.precisions.startswith("[") else a.precisions.split(",")
    out = envelopes(a.families.split(",") if a.families else None, precisions,
                    [int(s) for s in a.seeds.split(",")], a.steps,
                    command="python -m labkit.drift envelopes " + " ".join(argv),
                    log=lambda s: print(s, flush=True), save=lambda t: _write(t, a.out))
    print(f"wrote {a.out} ({out['provenance']['seconds']} s)")
    return 0


def _write(table: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")


def merge_main(argv) -> int:
    """``python -m labkit.drift merge PART.json ... --out data/envelopes.json``: parts measured
    by separate processes (--families split), as one table."""
    from .measure import merge
    ap = argparse.ArgumentParser(prog="python -m labkit.drift merge")
    ap.add_argument("parts", nargs="+")
    ap.add_argument("--out", default="data/envelopes.json")
    a = ap.parse_args(argv)
    tables = []
    for p in a.parts:
        with open(p) as f:
            tables.append(json.load(f))
    _write(merge(tables), a.out)
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["envelopes"]:
        return envelopes_main(argv[1:])
    if argv[:1] == ["merge"]:
        return merge_main(argv[1:])
    from .cli import main as drift_main
    return drift_main(argv)


if __name__ == "__main__":
    sys.exit(main())
