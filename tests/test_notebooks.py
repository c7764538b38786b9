"""Notebook tooling: student copies drop solutions; the grader counts checks; every stored notebook
is complete (all code cells executed) so nbval compares real outputs."""
import json
from pathlib import Path

import nbformat
import pytest

from labkit import notebooks


def _exercise_notebook(path: Path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("from labkit.check import report\nanswer = None"),
        nbformat.v4.new_code_cell("answer = 42", metadata={"tags": ["solution"]}),
        nbformat.v4.new_code_cell("report('answer', answer == 42, f'answer is {answer}', 'think harder')"),
        nbformat.v4.new_code_cell("report('always', True, 'fine')"),
    ]
    nbformat.write(nb, path)


def test_student_copy_drops_solutions_and_outputs(tmp_path):
    src, dst = tmp_path / "lab.ipynb", tmp_path / "student.ipynb"
    _exercise_notebook(src)
    assert notebooks.student_copy(src, dst) == 1
    nb = nbformat.read(dst, as_version=4)
    assert len(nb.cells) == 3 and all("solution" not in c.metadata.get("tags", []) for c in nb.cells)
    assert all(c.outputs == [] for c in nb.cells)


def test_grade_counts_pass_and_fail(tmp_path, capsys):
    src, dst = tmp_path / "lab.ipynb", tmp_path / "student.ipynb"
    _exercise_notebook(src)
    assert notebooks.grade(src) == (2, 0)          # with the solution
    notebooks.student_copy(src, dst)
    assert notebooks.grade(dst) == (1, 1)          # without it, the answer check fails
    out = capsys.readouterr().out
    assert "[check] FAIL answer: answer is None" in out and "1 passed, 1 failed" in out


@pytest.mark.parametrize("path", notebooks.all_notebooks(), ids=lambda p: p.name)
def test_every_notebook_is_stored_with_outputs(path):
    nb = json.loads(Path(path).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    unrun = [i for i, c in enumerate(code) if c.get("execution_count") is None
             and "nbval-skip" not in c.get("metadata", {}).get("tags", [])]
    assert not unrun, f"{path}: code cells {unrun} have no stored output; run python -m labkit.notebooks refresh"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path}: stored outputs contain an error"
