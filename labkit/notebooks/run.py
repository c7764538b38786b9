"""Execute notebooks: ``refresh`` stores the outputs every stored notebook carries."""
from __future__ import annotations

import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("book", "labs", "solutions")   # solutions/: the instructors' masters, run like the rest


def all_notebooks() -> list[Path]:
    found = []
    for folder in FOLDERS:
        found += [p for p in sorted((ROOT / folder).rglob("*.ipynb"))
                  if "_build" not in p.parts and ".ipynb_checkpoints" not in p.parts]
    return found


def execute(nb, path: Path, timeout: int = 600):
    """Run every cell of ``nb`` (an nbformat node) with the notebook's folder as cwd."""
    from nbclient import NotebookClient
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                            record_timing=False, resources={"metadata": {"path": str(Path(path).parent)}})
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
