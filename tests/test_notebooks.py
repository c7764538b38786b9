"""Notebook tooling: student copies drop solutions; every lab is the student copy of its master in
solutions/; every stored notebook is complete (all code cells executed) so nbval compares real
outputs. The grader itself: tests/test_grader.py."""
import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tools (requirements.txt) are not installed")

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


def test_grader_refuses_a_master_without_exercise_metadata(tmp_path):
    # version 1's labs marked solutions by tag only: the grader cannot know the exercises or points
    from labkit.notebooks.gradebook import MasterError, load_master
    _exercise_notebook(tmp_path / "lab.ipynb")
    with pytest.raises(MasterError, match="names no exercise"):
        load_master(tmp_path / "lab.ipynb")


MASTERS = sorted((notebooks.ROOT / "solutions").glob("*.ipynb"))


@pytest.mark.parametrize("master", MASTERS, ids=lambda p: p.name)
def test_every_lab_is_the_student_copy_of_its_master(master):
    """solutions/X.ipynb is a valid master; labs/X.ipynb is exactly its student copy (no drift)."""
    m = nbformat.read(master, as_version=4)
    assert notebooks.validate(m, kind="master") == []
    lab = notebooks.ROOT / "labs" / master.name
    assert lab.exists(), f"no {lab}: python -m labkit.notebooks student-copy {master} {lab} --refresh"
    problems = notebooks.validate(nbformat.read(lab, as_version=4), kind="student", master=m)
    assert not problems, (f"{lab} is not the student copy of {master}: " + "; ".join(problems) +
                          f". Regenerate: python -m labkit.notebooks student-copy {master} {lab} --refresh")
    # each says which copy it is: the master that it holds the solutions, the student copy that
    # its checks fail until the exercises are written
    from labkit.notebooks.student import MASTER_BANNER, STUDENT_BANNER
    intro, lab_intro = m.cells[0].source, nbformat.read(lab, as_version=4).cells[0].source
    assert MASTER_BANNER in intro and STUDENT_BANNER not in intro, master.name
    assert STUDENT_BANNER in lab_intro and MASTER_BANNER not in lab_intro, lab.name


def test_every_lab_has_a_master_once_solutions_exist():
    # labs/ holds only student copies: no lab without its master, no master without its lab
    if not MASTERS:
        pytest.skip("no solutions/ masters yet (labs/ still hold their solutions: version 1)")
    labs, masters = {p.name for p in (notebooks.ROOT / "labs").glob("*.ipynb")}, {p.name for p in MASTERS}
    assert labs == masters, f"labs without a master: {sorted(labs - masters)}; masters without a lab: " \
                            f"{sorted(masters - labs)}"


@pytest.mark.parametrize("path", notebooks.all_notebooks(), ids=lambda p: p.name)
def test_every_notebook_is_stored_with_outputs(path):
    nb = json.loads(Path(path).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    unrun = [i for i, c in enumerate(code) if c.get("execution_count") is None
             and "nbval-skip" not in c.get("metadata", {}).get("tags", [])]
    assert not unrun, f"{path}: code cells {unrun} have no stored output; run python -m labkit.notebooks refresh"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path}: stored outputs contain an error"


@pytest.mark.parametrize("master", MASTERS, ids=lambda p: p.name)
def test_every_exercise_is_a_check_spec_with_hidden_cases(master):
    """Each exercise of each lab is graded in isolation (a labkit.check Spec), its check cell keeps its
    own reference to the check module, and its hidden cases (solutions/hidden/) are cases its check
    accepts. A prediction of one number (the interleaved lab's bubble and messages) and an answer
    read off one run for the student's seed (the debugging lab's planted bug and hang) have no other
    case to hide; every lab has hidden cases for its other exercises."""
    import inspect
    import json

    from labkit.check.registry import IN_PROCESS, find
    from labkit.notebooks.schema import exercises
    if master.stem in IN_PROCESS:
        pytest.skip(f"{master.name} is graded in-process (labkit.check.registry.IN_PROCESS)")
    nb = nbformat.read(master, as_version=4)
    hidden_path = master.parent / "hidden" / master.name.replace(".ipynb", ".json")
    hidden = json.loads(hidden_path.read_text())
    # answers a seed chooses (each student's SEED is the hidden case): no hidden case file entry
    numbers = {"bubble", "messages", "planted-bug", "hang", "name-the-finding"}
    for ex in exercises(nb):
        spec = find(ex.id)
        assert spec is not None, f"{master.name}: exercise {ex.id!r} is not a labkit.check Spec"
        assert "from labkit.check import" in ex.check_source, f"{ex.id}: the check cell imports its own check"
        assert ex.id in hidden or ex.id in numbers, f"{master.name}: no hidden case for {ex.id!r}"
        for case in list(spec.cases) + hidden.get(ex.id, []):
            inspect.signature(spec.judge).bind(None, **case)
            inspect.signature(spec.produce).bind(None, **case)
    assert set(hidden) <= {ex.id for ex in exercises(nb)}, "hidden cases of an exercise the lab does not have"
