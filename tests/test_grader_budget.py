"""A budget per submission, and a seccomp filter (issue 33, "resources are per process, not per submission").

Graded for real in bubblewrap, next to an honest student, on the tiny lab's "double": a submission
that tries ``unshare``, ``mount``, ``ptrace`` and ``keyctl`` gets EPERM for each (the filter of
``labkit.notebooks.seccomp``) while ``fork`` still works; one that writes seven files of 250 MiB in
its folder, ``/tmp`` and ``/dev/shm`` fits one in each 256 MiB tmpfs and writes nothing on the host;
one whose cells each sleep just under the cell timeout is stopped by the submission's total time.
Each answer returns 2x only when the box held, so full marks mean the limits worked; the honest
student gets full marks in the same run.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tools (requirements.txt) are not installed")

from labkit import notebooks
from labkit.notebooks import seccomp
from labkit.notebooks.sandbox import Sandbox

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "tiny-master.ipynb"
WHY = Sandbox("bwrap").available()
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"the sandbox cannot run here: {WHY}")

SYSCALLS = '''
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def refused(nr, *args):
    return libc.syscall(nr, *args) == -1 and ctypes.get_errno() == errno.EPERM
held = [refused(272, 0x10000000), refused(165, b"none", b"/grade", b"tmpfs", 0, None), refused(101, 0, 0, 0, 0),
        refused(250, 0, 0, 0, 0), refused(308, 0, 0)]
pid = os.fork()
if pid == 0:
    os._exit(0)
held.append(os.waitpid(pid, 0)[1] == 0)
def double(x):
    return 2 * x if all(held) else -1
'''
DISK = '''
import os
def fill(path):
    try:
        with open(path, "wb") as f:
            for _ in range(250):
                f.write(b"x" * 2**20)
        return False
    except OSError:
        return True
capped = [fill(p) for p in ("a.bin", "b.bin", "c.bin", "/tmp/d.bin", "/tmp/e.bin", "/dev/shm/f.bin", "/dev/shm/g.bin")]
def double(x):
    return 2 * x if sum(capped) >= 4 else -1
'''
SLOW = "import time\ntime.sleep(8)\ndef double(x):\n    return 2 * x\n"


@pytest.mark.skipif(seccomp.program() is None, reason="the seccomp filter is built for x86-64 only")
@pytest.mark.slow
def test_syscalls_refused_disk_capped_time_capped_honest_full(tmp_path):
    nb = nbformat.read(TINY, as_version=4)
    keep = {"title", "setup", "double-text", "double-stub", "double-solution", "double-check"}
    nb.cells = [c for c in nb.cells if c.id in keep]
    master = tmp_path / "solutions" / "double-lab.ipynb"
    master.parent.mkdir()
    nbformat.write(nb, master)
    subs = {}
    for name, code in (("syscalls", SYSCALLS), ("disk", DISK), ("slow", SLOW * 4),
                       ("honest", "def double(x):\n    return 2 * x\n")):
        path = tmp_path / f"{name}.ipynb"
        notebooks.student_copy(master, path)
        s = nbformat.read(path, as_version=4)
        stub = next(c for c in s.cells if c.id == "double-stub")
        stub.source = code
        if name == "slow":                   # four cells of 8 s each: under the 10 s cell timeout, over the 30 s total
            for k in range(3):
                extra = nbformat.v4.new_code_cell(SLOW, id=f"slow-{k}")
                s.cells.insert(s.cells.index(stub), extra)
        nbformat.write(s, path)
        subs[name] = path
    work = tmp_path / "work"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "labkit.notebooks", "grade", *map(str, subs.values()), "--master",
                           str(master), "--out", str(tmp_path / "grades"), "--json", "--timeout", "10",
                           "--total-seconds", "30", "--workdir", str(work), "--keep"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    rows = {Path(r["submission"]).stem: r for r in map(json.loads, proc.stdout.splitlines())}
    assert set(rows) == set(subs), proc.stderr[-3000:]
    assert rows["honest"]["points"] == 1 and rows["syscalls"]["points"] == 1, rows
    assert rows["disk"]["points"] == 1, rows["disk"]
    slow = rows["slow"]["exercises"][0]
    assert slow["points"] == 0 and slow["status"] == "timeout" and "total time" in slow["message"], slow
    on_host = sum(f.stat().st_size for f in work.rglob("*") if f.is_file() and f.suffix == ".bin")
    assert on_host == 0                                       # the 1 GiB went to capped tmpfs, not the disk


def test_the_filter_is_well_formed():
    prog = seccomp.program()
    if prog is None:
        pytest.skip("x86-64 only")
    assert len(prog) % 8 == 0 and len(prog) // 8 < 4096          # BPF_MAXINSNS
    import struct
    ops = [struct.unpack("=HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
    assert ops[-1] == (seccomp.RET_K, 0, 0, seccomp.RET_ALLOW)
    refused = {k for code, jt, jf, k in ops if code == seccomp.JEQ_K}
    assert {272, 101, 165, 250, 308, seccomp.CLONE, seccomp.CLONE3} <= refused
    for i, (code, jt, jf, k) in enumerate(ops):                 # every jump lands inside the program
        if code in (seccomp.JEQ_K, seccomp.JGE_K, seccomp.JSET_K):
            assert i + 1 + max(jt, jf) < len(ops)
