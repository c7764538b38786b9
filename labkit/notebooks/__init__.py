"""Notebook tooling: stored outputs, student copies, validation, grading.

    python -m labkit.notebooks refresh [NOTEBOOK ...]            execute in place, store outputs
    python -m labkit.notebooks student-copy MASTER OUT [--refresh]  drop solutions, keep cell ids
    python -m labkit.notebooks validate NOTEBOOK... [--master M]  check masters / student copies
    python -m labkit.notebooks grade SUBMISSION... --master M [--out grades] [--timeout 60] [--sandbox bwrap]
    python -m labkit.notebooks run-autograder --master M      Gradescope: /autograder/results/results.json

``refresh`` is the only way stored outputs are made; ``pytest --nbval`` re-executes each notebook
and compares, which proves the stored outputs (and so the rendered book) are current. With no
argument it refreshes every notebook under book/, labs/ and solutions/.

Solutions are kept apart: ``solutions/X.ipynb`` is the instructor's master (stub, solution and
check cell per exercise, metadata in ``schema.py``), stored with outputs so CI proves every
solution passes its checks; ``labs/X.ipynb`` is its student copy (``student.py``), refreshed, so
its stored check outputs show the FAIL a student first meets. ``grader.py`` grades submissions
against the master, one exercise at a time in a fresh sandboxed process (``answers.py`` picks
the answer cells, ``sandbox.py`` runs them, ``labkit.check`` judges), ``gradebook.py`` writes the
class's JSON, CSV and Canvas CSV after each submission, ``gradescope.py`` the results.json of
Gradescope's autograder, ``integrity.py`` checks that labkit and the master did not change, and
``validation.py`` checks masters and copies; ``preflight.py`` grades the master first (full marks
or nothing is graded), ``events.py`` reads the sandbox's lines as a schema, ``seccomp.py`` builds
the sandbox's system-call filter. book/instructors.md is the guide, with the threat model.
Modules: run, schema, student, validation, answers, events, seccomp, children, sandbox, grader,
integrity, preflight, gradebook, gradescope, cli.
"""
from .gradebook import grade
from .run import ROOT, all_notebooks, execute, refresh
from .student import differences, make_student_copy, student_copy
from .validation import kind_of, validate

__all__ = ["ROOT", "all_notebooks", "differences", "execute", "grade", "kind_of", "make_student_copy",
           "refresh", "student_copy", "validate"]
