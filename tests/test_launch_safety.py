"""Tier 2: the launcher fails safely (issue 24). Killing only the parent of ``python -m labkit train``
leaves no process (ranks, forkserver, resource tracker) and no temporary folder, checked by process
tree on Linux; a world the machine cannot hold is refused before anything is forked; a rank that dies
by a signal is named with the signal. Small worlds; the waits are deadlines, not measurements."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import cloudpickle
import pytest

import labkit
from labkit import launch_collect
from labkit.launcher import RankFailed

cloudpickle.register_pickle_by_value(sys.modules[__name__])
ROOT = Path(__file__).resolve().parent.parent
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree in /proc")
_TMPDIRS: list = []


@pytest.fixture(autouse=True, scope="module")
def _remove_tmpdirs():
    yield
    for d in _TMPDIRS:
        shutil.rmtree(d, ignore_errors=True)


def session(sid: int) -> list:
    """(pid, command) of every live process in session ``sid`` (zombies excluded)."""
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[3]) == sid and fields[0] not in "ZX":
                out.append((int(d.name), (d / "cmdline").read_bytes().replace(b"\0", b" ")[:80].decode()))
        except (OSError, ValueError):
            pass
    return out


def _start(argv, tmp_path, ranks):
    """Start ``argv`` in a new session with its own empty TMPDIR; wait for its ``ranks`` ranks."""
    # a short TMPDIR of its own: multiprocessing binds the forkserver's AF_UNIX socket in it
    # (pymp-XXXXXXXX/listener-XXXXXXXX), and a socket path over 107 bytes cannot bind
    tmp = Path(tempfile.mkdtemp(prefix="lks-"))
    _TMPDIRS.append(tmp)
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(ROOT))
    p = subprocess.Popen(argv, cwd=tmp_path, env=env, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180                  # startup under load: imports torch twice
    while len(session(p.pid)) < ranks + 3:             # caller, resource tracker, forkserver, ranks
        assert p.poll() is None, p.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, f"ranks never started: {session(p.pid)}"
        time.sleep(0.1)
    time.sleep(1.0)                                    # let them work
    return p, tmp


def _kill_and_watch(p, sig, within=20.0):
    """Kill only the caller; seconds until its whole session is gone (None: something stayed)."""
    before = session(p.pid)
    os.kill(p.pid, sig)
    p.wait()
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < within:
            if not session(p.pid):
                return time.monotonic() - t0, before
            time.sleep(0.01)
        return None, session(p.pid)
    finally:
        for pid, _ in session(p.pid):                  # never leave a stray process behind
            os.kill(pid, signal.SIGKILL)


@LINUX
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_killing_only_the_parent_of_labkit_train_leaves_no_process_and_no_folder(sig, tmp_path):
    p, tmp = _start([sys.executable, "-m", "labkit", "train", "--world-size", "2", "--train-iters",
                     "1000000", "--log-interval", "0"], tmp_path, ranks=2)
    gone, seen = _kill_and_watch(p, sig)
    assert gone is not None, f"still running after the caller died: {seen}"
    assert len(seen) == 5                              # caller, tracker, forkserver, 2 ranks: all gone
    left = [f.name for f in tmp.iterdir() if not f.name.startswith("torchinductor_")]  # torch's own cache
    assert left == []                                  # rank logs are unnamed files: no folder left


GIL_HELD = """
import ctypes, labkit
def hold():
    ctypes.PyDLL(None).sleep(600)     # libc sleep WITH the GIL: the rank's watchdog thread cannot run
labkit.launch(hold, 2, backend="gloo", timeout=900)
"""


@LINUX
def test_a_rank_stuck_holding_the_gil_dies_with_the_forkserver(tmp_path):
    """Linux: the forkserver exits when its parent goes, and PR_SET_PDEATHSIG kills its ranks."""
    script = tmp_path / "hold.py"
    script.write_text(textwrap.dedent(GIL_HELD))
    p, _ = _start([sys.executable, str(script)], tmp_path, ranks=2)
    gone, seen = _kill_and_watch(p, signal.SIGKILL)
    assert gone is not None, f"still running after the caller died: {seen}"


def _noop():
    return 0


def test_a_world_the_machine_cannot_hold_is_refused_before_anything_starts(monkeypatch):
    monkeypatch.setattr(labkit.launcher.mp, "get_context", lambda *a: pytest.fail("a process was started"))
    with pytest.raises(ValueError, match=r"^world_size 10000: 10000 ranks need at least [\d,.]+ GiB \(20 MiB "
                                         r"per rank: 20 MiB for the process \+ 0 MiB .*\), more than the "
                                         r"[\d.]+ GiB this machine has available"):
        labkit.launch(_noop, 10000, backend="gloo")


def test_capacity_numbers_by_hand():
    mib, gib = 2 ** 20, 2 ** 30
    base, server = launch_collect.RANK_BASE_BYTES, launch_collect.FORKSERVER_BYTES
    launch_collect.check_capacity(8, 100 * mib, memory=8 * (base + 100 * mib) + server, open_files=20000)
    with pytest.raises(ValueError, match=r"^world_size 8: 8 ranks need at least 1\.2 GiB \(120 MiB per rank: "
                                         r"20 MiB for the process \+ 100 MiB .*more than the 1\.0 GiB"):
        launch_collect.check_capacity(8, 100 * mib, memory=gib, open_files=20000)
    with pytest.raises(ValueError, match=r"^world_size 200: 200 ranks need about 1264 open files .* limit 1024"):
        launch_collect.check_capacity(200, 0, memory=64 * gib, open_files=1024)


def _die_by(signum):
    import os
    os.kill(os.getpid(), signum)


def test_a_rank_killed_by_a_signal_is_named():
    with pytest.raises(RankFailed, match=r"killed by SIGBUS: a memory-mapped file") as err:
        labkit.launch(_die_by, 1, signal.SIGBUS, backend="gloo", timeout=60)
    assert "Fatal Python error: Bus error" in err.value.output   # faulthandler's stack, captured
    assert err.value.summary.startswith("rank 0 failed: process exited with code -7")


@pytest.mark.parametrize("name, value", [("timeout", float("nan")), ("timeout", float("inf")),
                                         ("timeout", -1), ("collective_timeout", float("nan"))])
def test_timeouts_must_be_finite_and_positive(name, value):
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number of seconds > 0"):
        labkit.launch(_noop, 1, backend="gloo", **{name: value})
