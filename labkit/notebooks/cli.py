"""``python -m labkit.notebooks refresh|student-copy|validate|grade|run-autograder``; see the package docstring."""
from __future__ import annotations

import argparse
import json
import sys


def _sandbox_args(p) -> None:
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds for each answer cell and each check case (default 60)")
    p.add_argument("--sandbox", choices=["bwrap", "docker", "none"], default="bwrap",
                   help="where submissions run (default bwrap: Debian's bubblewrap)")
    p.add_argument("--image", default="", help="the container image for --sandbox docker")
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="allow --sandbox none: submissions then run as you, and can read and write your files")
    p.add_argument("--memory-gib", type=float, default=6.0, help="address-space limit per process (default 6)")
    p.add_argument("--memory-total-gib", type=float, default=3.0,
                   help="memory of one run of a submission, all its processes and files together, where the "
                        "grader can make a cgroup (cgroup v1, as root; default 3; 0: none)")
    p.add_argument("--max-files", type=int, default=4096,
                   help="files in each of the sandbox's /grade, /tmp, /dev/shm (bwrap as root; default 4096)")
    p.add_argument("--cpu-seconds", type=int, default=900, help="CPU-time limit per process (default 900)")
    p.add_argument("--total-seconds", type=float, help="seconds for a whole submission, all its runs "
                   "(default 20 x --timeout)")
    p.add_argument("--hidden", help="hidden-test file (default: hidden/<master>.json beside the master)")
    p.add_argument("--keep", action="store_true", help="keep each submission's folder (to debug grading)")


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
    g.add_argument("--out", default="grades", help="folder for the gradebook (<assignment>.json/.csv/-canvas.csv)")
    g.add_argument("--json", action="store_true", help="print one JSON object per submission")
    g.add_argument("--assignment", help="the assignment's name in the gradebook (default: the master's name)")
    g.add_argument("--id-pattern", help="regular expression with a group 'id' that finds the student id in "
                   "a submission's path (default: the file name without .ipynb)")
    g.add_argument("--roster", help="CSV with a column 'id' (and name, file, canvas_id, sis_user_id, "
                   "sis_login_id, section)")
    g.add_argument("--canvas-assignment-id", help="Canvas's id of the assignment, for the import column")
    g.add_argument("--resume", action="store_true", help="skip submissions already in the gradebook")
    g.add_argument("--workdir", help="where the per-submission folders are made (default: the system's)")
    _sandbox_args(g)
    a = sub.add_parser("run-autograder", aliases=["run_autograder"], help="grade one Gradescope submission")
    a.add_argument("--master", required=True)
    a.add_argument("--submission-dir", default="/autograder/submission")
    a.add_argument("--results", default="/autograder/results/results.json")
    _sandbox_args(a)
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
    elif args.cmd == "grade":
        return _grade(args)
    else:
        return _autograde(args)
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


def options(args):
    """Grader options from the flags, or (None, why not) when the sandbox asked for cannot run."""
    from .grader import Options
    from .children import become_subreaper
    from .sandbox import Limits, Sandbox
    if args.timeout <= 0:
        return None, "--timeout must be > 0 seconds"
    if args.sandbox == "none" and not args.unsafe_no_sandbox:
        return None, ("--sandbox none runs every submission as you, with your files in reach: add "
                      "--unsafe-no-sandbox to do it anyway (book/instructors.md, 'Threat model')")
    try:
        box = Sandbox(args.sandbox, image=args.image, limits=Limits(
            cpu_seconds=args.cpu_seconds, memory_bytes=int(args.memory_gib * 2**30),
            total_memory_bytes=int(args.memory_total_gib * 2**30), files=args.max_files))
    except ValueError as e:
        return None, str(e)
    why = box.available()
    if why:
        return None, (f"sandbox {args.sandbox!r} is not available: {why}. Install bubblewrap (Debian: "
                      "apt-get install bubblewrap), or use --sandbox docker --image IMAGE; grading without a "
                      "sandbox needs --sandbox none --unsafe-no-sandbox")
    if box.kind == "none":
        become_subreaper()
    return Options(sandbox=box, timeout=args.timeout, keep=args.keep, total=args.total_seconds,
                   workdir=getattr(args, "workdir", None)), ""


def _grade(args) -> int:
    from .gradebook import MasterError, grade, human
    from .integrity import IntegrityError
    opts, why = options(args)
    if opts is None:
        print(f"error: {why}", file=sys.stderr)
        return 2

    def show(result):
        print(json.dumps(result) if args.json else human(result), flush=True)
    try:
        results = grade(args.submissions, args.master, args.out, opts, on_result=show,
                        assignment=args.assignment, id_pattern=args.id_pattern, roster=args.roster,
                        canvas_id=args.canvas_assignment_id, hidden_path=args.hidden, resume=args.resume)
    except (MasterError, ValueError, IntegrityError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.json:
        print(f"wrote {args.out}/: the gradebook (JSON, CSV, Canvas CSV)", file=sys.stderr)
    return 0 if all(r["points"] == r["max_points"] for r in results) else 1


def _autograde(args) -> int:
    from .gradescope import results_json, run_autograder
    opts, why = options(args)
    if opts is None:
        from pathlib import Path
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        Path(args.results).write_text(json.dumps(results_json(None, 0, f"grader not run: {why}")))
        print(f"error: {why}", file=sys.stderr)
        return 2
    out = run_autograder(args.master, args.submission_dir, args.results, opts, args.hidden)
    print(out["output"])
    return 0
