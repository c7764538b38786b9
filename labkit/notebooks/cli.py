"""``python -m labkit.notebooks refresh|student-copy|validate|grade``; see the package docstring."""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.notebooks")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("refresh", help="execute notebooks in place (default: all)")
    r.add_argument("paths", nargs="*")
    s = sub.add_parser("student-copy", help="a master without its solutions, cell ids kept")
    s.add_argument("src")
    s.add_argument("dst")
    s.add_argument("--refresh", action="store_true", help="then execute the copy in place")
    v = sub.add_parser("validate", help="check masters and student copies")
    v.add_argument("paths", nargs="+")
    v.add_argument("--kind", choices=["master", "student"], help="default: detected per notebook")
    v.add_argument("--master", help="also require each student copy to equal this master's")
    g = sub.add_parser("grade", help="grade submissions against a master")
    g.add_argument("submissions", nargs="+")
    g.add_argument("--master", required=True, help="the instructor's notebook (solutions/X.ipynb)")
    g.add_argument("--out", default="grades", help="folder for <master>.json and <master>.csv")
    g.add_argument("--timeout", type=float, default=300.0, help="seconds per cell (default 300)")
    g.add_argument("--json", action="store_true", help="print one JSON object per submission")
    args = ap.parse_args(argv)
    if args.cmd == "refresh":
        from .run import all_notebooks, refresh
        refresh(args.paths or all_notebooks())
    elif args.cmd == "student-copy":
        from .run import refresh
        from .student import student_copy
        print(f"dropped {student_copy(args.src, args.dst)} solution cells -> {args.dst}")
        if args.refresh:
            refresh([args.dst])
    elif args.cmd == "validate":
        return _validate(args)
    else:
        return _grade(args)
    return 0


def _validate(args) -> int:
    import nbformat
    from .schema import exercises
    from .validation import kind_of, validate
    master = nbformat.read(args.master, as_version=4) if args.master else None
    bad = 0
    for path in args.paths:
        nb = nbformat.read(path, as_version=4)
        kind = args.kind or kind_of(nb)
        problems = validate(nb, kind, master if kind == "student" else None)
        if problems:
            bad += 1
            print(f"INVALID {path} ({kind}):\n  " + "\n  ".join(problems))
        else:
            exs = [e for e in exercises(nb)]
            print(f"OK {path} ({kind}: {len(exs)} exercises, {sum(e.max_points for e in exs)} points)")
    return 1 if bad else 0


def _grade(args) -> int:
    from .gradebook import MasterError, grade, human
    if args.timeout <= 0:
        print("error: --timeout must be > 0 seconds", file=sys.stderr)
        return 2

    def show(result):
        print(json.dumps(result) if args.json else human(result), flush=True)
    try:
        results = grade(args.submissions, args.master, args.out, args.timeout, on_result=show)
    except MasterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.json:
        print(f"wrote {args.out}/: a JSON file and a CSV gradebook", file=sys.stderr)
    return 0 if all(r["points"] == r["max_points"] for r in results) else 1
