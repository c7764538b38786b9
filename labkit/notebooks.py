"""Notebook tooling: refresh stored outputs, make a student copy, grade a notebook.

    python -m labkit.notebooks refresh [NOTEBOOK ...]     execute in place, store outputs + widget state
    python -m labkit.notebooks student-copy IN OUT        drop cells tagged "solution"
    python -m labkit.notebooks grade NOTEBOOK             execute a copy, report every [check] line

``refresh`` is the only way stored outputs are made; ``pytest --nbval`` re-executes each notebook
and compares, which proves the stored outputs (and so the rendered book) are current. With no
argument it refreshes every notebook under labs/ and book/.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def all_notebooks() -> list[Path]:
    found = []
    for folder in ("book", "labs"):
        found += [p for p in sorted((ROOT / folder).rglob("*.ipynb"))
                  if "_build" not in p.parts and ".ipynb_checkpoints" not in p.parts]
    return found


def execute(nb, path: Path, timeout: int = 600):
    """Run every cell of ``nb`` (an nbformat node) with the notebook's folder as cwd."""
    from nbclient import NotebookClient
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                            record_timing=False, resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


def refresh(paths) -> list[tuple[Path, float]]:
    """Execute each notebook in place; returns (path, seconds) per notebook."""
    import nbformat
    times = []
    for path in map(Path, paths):
        nb = nbformat.read(path, as_version=4)
        t0 = time.perf_counter()
        execute(nb, path)
        seconds = time.perf_counter() - t0
        if not _has_widgets(nb):
            nb.metadata.pop("widgets", None)
        nbformat.write(nb, path)
        times.append((path, seconds))
        print(f"refreshed {path} in {seconds:.1f} s", flush=True)
    return times


def _has_widgets(nb) -> bool:
    return any("application/vnd.jupyter.widget-view+json" in out.get("data", {})
               for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", []))


def student_copy(src, dst) -> int:
    """Write ``dst`` = ``src`` without cells tagged "solution", outputs cleared. Returns cells dropped."""
    import nbformat
    nb = nbformat.read(src, as_version=4)
    kept = [c for c in nb.cells if "solution" not in c.metadata.get("tags", [])]
    dropped = len(nb.cells) - len(kept)
    nb.cells = kept
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    nb.metadata.pop("widgets", None)
    Path(dst).parent.mkdir(parents=True, exist_ok=True)  # the documented student/ need not exist
    nbformat.write(nb, dst)
    return dropped


def grade(path) -> tuple[int, int]:
    """Execute a copy of the notebook (errors allowed) and count PASS/FAIL check lines."""
    import nbformat
    from nbclient import NotebookClient
    path = Path(path)
    nb = copy.deepcopy(nbformat.read(path, as_version=4))
    NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True, record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    passed = failed = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text = out.get("text", "") or out.get("data", {}).get("text/plain", "")
            for line in text.splitlines():
                if line.startswith("[check] PASS"):
                    passed += 1
                    print(line)
                elif line.startswith("[check] FAIL"):
                    failed += 1
                    print(line)
    print(f"{path}: {passed} passed, {failed} failed")
    return passed, failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.notebooks")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("refresh", help="execute notebooks in place (default: all)")
    r.add_argument("paths", nargs="*")
    s = sub.add_parser("student-copy", help="drop solution cells")
    s.add_argument("src")
    s.add_argument("dst")
    g = sub.add_parser("grade", help="execute a notebook and count its checks")
    g.add_argument("path")
    args = ap.parse_args(argv)
    if args.cmd == "refresh":
        refresh(args.paths or all_notebooks())
    elif args.cmd == "student-copy":
        print(f"dropped {student_copy(args.src, args.dst)} solution cells -> {args.dst}")
    else:
        return 1 if grade(args.path)[1] else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
