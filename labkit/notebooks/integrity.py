"""Is what the grader trusts still what it was? A fingerprint of labkit, the master and the hidden tests.

The sandbox mounts labkit read-only and never mounts the master or the hidden tests, so no
submission can change them; without a sandbox (``--sandbox none``) one can. Either way the
grader takes this fingerprint before the first submission and compares it after each one: a
change (a file edited, added or removed) stops the run with the file named, before a later
student is graded by changed checks (what happened when a submission appended a fake check to
``labkit/check/pipeline.py``).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path


class IntegrityError(RuntimeError):
    """A file the grader trusts changed while a submission was graded."""


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:
        return f"unreadable: {e.strerror}"


def _files(labkit_root: Path, trusted) -> list[Path]:
    found = [p for p in (labkit_root / "labkit").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return sorted(found) + [Path(t) for t in trusted]


@dataclass
class Fingerprint:
    labkit_root: Path
    trusted: tuple                   # the master, the hidden-test file (when there is one)
    files: dict                      # path -> sha256

    @classmethod
    def of(cls, labkit_root, *trusted) -> "Fingerprint":
        root = Path(labkit_root)
        return cls(root, trusted, {str(p): _digest(p) for p in _files(root, trusted)})

    def verify(self, after: str) -> None:
        """Raise :class:`IntegrityError` if anything changed (``after``: the submission just graded)."""
        now = Fingerprint.of(self.labkit_root, *self.trusted)
        changed = sorted(p for p in set(self.files) | set(now.files) if self.files.get(p) != now.files.get(p))
        if changed:
            raise IntegrityError(f"while grading {after}, files the grader trusts changed: "
                                 f"{', '.join(changed[:5])}; grading stopped (results so far are saved). "
                                 "Restore them (git checkout) and grade with a sandbox")
