"""book/troubleshooting.md cannot drift: every CPU case marked "(run)" is run again, from the code on
the page, and the message it prints now must be the one the page shows; quotations from PyTorch's
docstrings, the static calculators and the grader are checked against their sources.

How a message is compared: the page's ```text block after the case, line by line, must appear in
the new output in the same order. Lines that name this machine are not compared: ``File`` lines
outside labkit (the notebook cell, site-packages), the source lines Python echoes under them, and
the ``...`` the page uses to elide. ``File`` lines inside labkit are compared (path from
``labkit/``, line number and function), so a traceback that moves is noticed. About 40 s on the
2-core machine (a 5 s hang, a 5 s collective timeout and the CLI's cold starts); marked slow.
"""
import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

import labkit
from labkit.launcher import LaunchTimeout, RankFailed

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "book" / "troubleshooting.md").read_text()
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)

pytestmark = pytest.mark.slow


def _blocks():
    return [(m.start(), m.group(1), m.group(2)) for m in FENCE.finditer(PAGE)]


def _block_with(snippet: str, lang: str = "python") -> tuple[str, str]:
    """The page's ``lang`` block that contains ``snippet``, and the ```text block after it."""
    blocks = _blocks()
    for i, (_, lg, body) in enumerate(blocks):
        if lg == lang and snippet in body:
            after = next(b for _, l2, b in blocks[i + 1:] if l2 == "text")
            return body, after
    raise AssertionError(f"no {lang} block with {snippet!r} on the troubleshooting page")


def _text_after(marker: str) -> str:
    at = PAGE.index(marker)
    return next(body for start, lang, body in _blocks() if start > at and lang == "text")


def _comparable(text: str) -> list[str]:
    """The lines of a message that do not depend on the machine (see the module docstring)."""
    out, skipping = [], False
    for line in text.splitlines():
        if line.startswith('  File "'):
            m = re.match(r'  File ".*?(labkit/[^"]+)", (line \d+, in \w+)', line)
            skipping = m is None
            if m:
                out.append(f'  File "{m.group(1)}", {m.group(2)}')
            continue
        if line.startswith("    ") and skipping:        # source echoed under a skipped File line
            continue
        skipping = False
        if line.strip() in ("...", "") or line.startswith("Traceback"):
            continue
        # the folder torch was built in shows in gloo's messages: [/__w/pytorch/pytorch/third_party/..
        out.append(re.sub(r"\[/\S*?/third_party/", "[.../third_party/", line.rstrip()))
    return out


def assert_shown(page_text: str, actual: str, normalize=lambda s: s) -> None:
    want = [normalize(x) for x in _comparable(page_text)]
    have = [normalize(x) for x in _comparable(actual)]
    i = 0
    for line in want:
        try:
            i = have.index(line, i) + 1
        except ValueError:
            raise AssertionError(f"the page shows {line!r}, the run printed:\n{actual}") from None


def _run_block(body: str, expect):
    """Execute a page block (its last statement is the launch); return the message it raises."""
    namespace = {"__name__": "troubleshooting_page"}
    exec("import os, time\nimport torch\nimport torch.distributed as dist\nimport labkit\n", namespace)
    with pytest.raises(expect) as info:
        exec(compile(body, "<troubleshooting.md>", "exec"), namespace)
    return f"{type(info.value).__name__}: {info.value}"


def test_a_rank_raises():
    body, shown = _block_with("def shard_sum():")
    assert_shown(shown, _run_block(body, RankFailed))


def test_the_ranks_hang():
    body, shown = _block_with("def wait_for_nothing():")
    assert_shown(shown, _run_block(body, LaunchTimeout))


def test_a_collective_times_out():
    body, shown = _block_with("def skip_all_reduce():")
    any_rank = lambda s: re.sub(r"rank \d", "rank N", re.sub(r"\[[\d, ]+\] failed too", "[...] failed too", s))
    assert_shown(shown, _run_block(body, RankFailed), any_rank)


def test_a_rank_dies_without_a_word():
    body, shown = _block_with("def exit_quietly():")
    assert_shown(shown, _run_block(body, RankFailed))


@pytest.mark.parametrize("name", ["tp_mlp_double_backward", "tp_mlp_no_f"])
def test_wrong_conjugates(name):
    imports, _ = _block_with("def tp_mlp_double_backward(")
    body, shown = _block_with(f"def {name}(")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(imports if name == "tp_mlp_double_backward" else imports.split("\ndef ")[0] + "\n" + body,
                     "<troubleshooting.md>", "exec"), {"__name__": "troubleshooting_page"})
    assert_shown(shown, out.getvalue())


@pytest.mark.parametrize("args", ["--world-size 3 --tensor-model-parallel-size 2",
                                  "--world-size 2 --tensor-model-parallel-size 2\n--num-attention-heads 5 --hidden-size 40",
                                  "--world-size 2 --micro-batch-size 2 --global-batch-size 6",
                                  "--world-size 0"])
def test_layouts_megatron_refuses(args):
    marker = f"(`{args}`)"
    assert marker in PAGE, marker
    run = subprocess.run([sys.executable, "-m", "labkit", "train", *args.split(), "--train-iters", "1"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 2, run.stderr
    assert_shown(_text_after(marker), run.stderr)


def test_out_of_memory_counts():
    body, shown = _block_with("gpt2_large = model(\"gpt2-774m\")")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(body, {})
    assert_shown(shown, out.getvalue())


def test_megatron_estimate():
    body, shown = _block_with("python -m labkit estimate", lang="bash")
    argv = body.replace("\\\n", " ").split()
    assert argv[:3] == ["python", "-m", "labkit"]
    run = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert_shown(shown, run.stdout)


def test_live_output_prefixes_each_line_with_its_rank(capfd):
    def hello():
        import torch.distributed as dist
        print(f"rank {dist.get_rank()} of {dist.get_world_size()} starting")
    labkit.launch(hello, 2, live_output=True)
    out = capfd.readouterr().out
    for r in range(2):
        line = f"[rank {r}] rank {r} of 2 starting"
        assert line in out and line in PAGE, (line, out)


def test_quotations_match_their_sources():
    import torch.distributed as dist

    def said(doc):
        return re.sub(r"\s+", " ", doc or "")
    page = re.sub(r"\s+", " ", PAGE)
    for quote, source in [
        ("``tag`` is not supported with the NCCL backend", dist.send.__doc__),
        ("the communicator is immediately formed (calling ``ncclCommInit*`` immediately rather than the "
         "normal lazy call)", dist.init_process_group.__doc__),
        ("if this API is the first collective call in the ``group`` passed to ``dist.P2POp``, all ranks of "
         "the ``group`` must participate in this API call; otherwise, the behavior is undefined.",
         dist.batch_isend_irecv.__doc__)]:
        assert quote in page and quote in said(source), quote
    assert "failed to start Python: " in (ROOT / "book" / "_static" / "explorers" / "calculators.js").read_text()
    assert "`failed to start Python:`" in PAGE
    # the grader's words the page quotes (section "The grader says missing, timeout or error")
    for phrase, source in [("your answer cells define no", "labkit/check/spec.py"),
                           ("the process running your code died", "labkit/notebooks/grader.py")]:
        assert phrase in (ROOT / source).read_text() and phrase in page, phrase
