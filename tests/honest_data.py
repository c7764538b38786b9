"""``python tests/honest_data.py``: what every lab master's answers produce for each visible case of
each exercise, run by the grader's own runner (``labkit.check.runner``, no sandbox), stored in
tests/fixtures/honest-data.json for tests/test_check_hostile_data.py (which first proves each
record still passes its judge, so a stale record fails the test rather than hiding anything)."""
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "honest-data.json"
LIMIT = 150_000                     # bytes of JSON per exercise (the tensor-heavy DP/ZeRO/loop ones are larger)


def main() -> int:
    import nbformat
    from labkit.check.registry import find
    from labkit.notebooks.answers import jobs
    from labkit.notebooks.sandbox import Sandbox, run_job
    found = {}
    for master_path in [ROOT / "tests" / "fixtures" / "tiny-master.ipynb", *sorted((ROOT / "solutions").glob("*.ipynb"))]:
        nb = nbformat.read(master_path, as_version=4)
        for job in jobs(nb, nb):
            spec = find(job.exercise.id)
            if spec is None or (len(sys.argv) > 1 and spec.id not in sys.argv[1:]):
                continue
            with tempfile.TemporaryDirectory() as d:
                folder = Path(d) / "x"
                folder.mkdir()
                payload = {"exercise": spec.id, "setup": job.setup, "answers": [list(a) for a in job.answers],
                           "cases": [dict(c) for c in spec.cases]}
                out = run_job(Sandbox("none"), folder, payload, timeout=300)
            data = {e["index"]: e["data"] for e in out.events if e["event"] == "data"}
            found[spec.id] = [data.get(k) for k in range(len(spec.cases))]
            print(spec.id, out.state, len(json.dumps(found[spec.id])), f"{out.seconds:.1f} s", flush=True)
    if len(sys.argv) > 1:                         # only these exercises: merged into the record
        found = {**json.loads(OUT.read_text()), **{k: v for k, v in found.items() if k in sys.argv[1:]}}
    small = {k: v for k, v in found.items() if len(json.dumps(v)) <= LIMIT}     # the repository keeps these
    OUT.write_text(json.dumps(small, separators=(",", ":"), allow_nan=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
