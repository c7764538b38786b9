"""Checks the student's code cannot reach (issue 23, "Checks that can be fooled from inside the notebook").

When grading, each exercise runs in a fresh process that receives only the answer cells' source
(``labkit.check.runner``), with labkit's implementation banned and the counting process group
installed before that source runs; the verdict is made by ``Spec.judge`` in the grader's process.
Every attack of the issue is an answer written here, graded that way (``sandbox none``: the bans
and the counting do not depend on the sandbox), and must FAIL its exercise; the honest answer of
the same exercise must PASS (so a check that always failed fails here too). Unit tests of the
pieces (the JSON wire, the counting group, the bans and ``reload``) come first. The isolated runs
take 3-8 s each on the 2-core machine (a fresh interpreter with torch, and ranks).
"""
import json
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from labkit.check import wire
from labkit.check.registry import find

SETUP = {
    "tp": "import torch\nimport torch.nn.functional as F\nfrom labkit import comm\nfrom labkit.model import causal_attention\n",
    "grid": "import labkit.calc as calc\n",
    "ep": "import torch\nimport torch.distributed as dist\n",
}


def isolated(exercise: str, answer: str, setup: str, cases=None, timeout: float = 60.0):
    """Grade ``answer`` for ``exercise`` as the grader does (runner in a fresh process, judge here)."""
    import tempfile
    from pathlib import Path

    from labkit.notebooks.sandbox import Sandbox, run_job
    spec = find(exercise)
    cases = cases or [dict(c) for c in spec.cases[:1]]
    job = {"exercise": exercise, "setup": [setup], "answers": [["your cell 1", textwrap.dedent(answer)]],
           "cases": cases}
    with tempfile.TemporaryDirectory() as d:
        out = run_job(Sandbox("none"), Path(d), job, timeout)
    data = {e["index"]: e["data"] for e in out.events if e.get("event") == "data"}
    assert data, f"the runner produced no data: {out.state} {out.detail} {out.events}"
    return [spec.judge(wire.decode(data[k]), **case) for k, case in enumerate(cases)]


def run_all(jobs):
    """Run several isolated gradings, two at a time (2 cores)."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda j: isolated(*j), jobs))


# -- the pieces --------------------------------------------------------------------------------
def test_wire_carries_data_and_tensors_only():
    import torch
    data = {"a": [1, 2.5, float("inf"), None, True, "x"], "t": torch.arange(6.0).reshape(2, 3),
            "i": torch.tensor([[1, 2]]), "b": torch.tensor([True, False])}
    back = wire.loads(wire.dumps(data))
    assert back["a"][:2] == [1, 2.5] and back["a"][2] == float("inf")
    assert torch.equal(back["t"], data["t"]) and back["i"].dtype == torch.int64 and back["b"].dtype == torch.bool
    for bad in (object(), {1: 2}, lambda: 0):
        with pytest.raises(wire.WireError):
            wire.dumps(bad)
    for forged in ('{"__tensor__": "float64", "shape": [3], "data": [1, 2]}',
                   '{"__tensor__": "object", "shape": [1], "data": [1]}', "[" * 100 + "]" * 100):
        with pytest.raises(wire.WireError):
            wire.loads(forged)


def _counting_worker():
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dist_nn

    from labkit import comm
    from labkit.check import instrument
    from labkit.groups import uncounted, world_group
    instrument.install()
    g = world_group()
    before = instrument.snapshot()
    x = torch.ones(4, dtype=torch.float64)
    comm.all_reduce(uncounted(g), x)                                  # labkit's bookkeeping group
    dist.all_gather([torch.empty_like(x) for _ in range(2)], x, group=g.pg)   # torch directly
    dist_nn.all_reduce(x.clone().requires_grad_(), group=g.pg)
    out = torch.empty(3, dtype=torch.float64)
    try:                                                              # rank 0 sends 1 row, rank 1 expects 2
        dist.all_to_all_single(out, torch.ones(3, dtype=torch.float64), [2, 1] if g.rank == 0 else [1, 2],
                               [1, 2] if g.rank == 0 else [2, 1], group=g.pg)
        err = ""
    except ValueError as e:
        err = str(e)
    return instrument.difference(instrument.snapshot(), before), err


def test_the_counting_group_counts_every_collective_and_names_mismatched_split_sizes():
    import labkit
    (counts, err), _ = labkit.launch(_counting_worker, 2, backend="gloo", timeout=60)
    assert counts["all_reduce"]["calls"] == 2 and counts["all_reduce"]["bytes"] == 2 * 32.0
    assert counts["all_gather"]["bytes"] == 32.0
    assert "rank 1 sends 2 rows to rank 0" in err and "expects 1" in err, err   # not a SIGABRT


BAN_SCRIPT = r"""
import importlib, sys, types
from labkit.check import Forbidden, bans
import labkit.moe as moe
from labkit.tensor_parallel import tp_comm
from labkit.tensor_parallel.layers import RowParallelLinear
bans.install(["labkit.moe:permute", "labkit.tensor_parallel.tp_comm:copy_to",
              "labkit.tensor_parallel.tp_comm:_CopyTo.forward", "labkit.tensor_parallel.layers:RowParallelLinear.forward"])
tries = {
    "copy": lambda: types.FunctionType(moe.permute.__code__, moe.permute.__globals__)(None),
    "captured": lambda: tp_comm._CopyTo.forward(None, None, None),
    "method": lambda: RowParallelLinear.forward(None, None),
    "reload": lambda: importlib.reload(tp_comm).copy_to(None, None),
    "fresh import": lambda: (sys.modules.pop("labkit.moe"), importlib.import_module("labkit.moe"))[1].permute(None),
}
out = {}
for name, fn in tries.items():
    try:
        fn()
        out[name] = "ran"
    except Forbidden:
        out[name] = "forbidden"
    except Exception as e:
        out[name] = type(e).__name__
print(out)
"""


def test_bans_hold_against_copies_captured_methods_reload_and_fresh_imports():
    import subprocess
    import sys
    got = subprocess.run([sys.executable, "-c", BAN_SCRIPT], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == str({k: "forbidden" for k in ("copy", "captured", "method", "reload",
                                                                 "fresh import")}), got.stdout


# -- the attacks of the issue, graded in isolation ---------------------------------------------
HONEST_F = """
class CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        return x.view_as(x)
    @staticmethod
    def backward(ctx, g):
        return None, comm.all_reduce(ctx.group, g)
class ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        return comm.all_reduce(group, x)
    @staticmethod
    def backward(ctx, g):
        return None, g
def my_f(group, x):
    return CopyTo.apply(group, x)
def my_f_bar(group, x):
    return ReduceFrom.apply(group, x)
"""
ATTACKS = [   # (exercise, setup, answer, words the FAIL must contain)
    ("conjugates", "tp", """
     from types import SimpleNamespace
     from labkit.tensor_parallel import tp_comm
     check = SimpleNamespace(conjugates=lambda *a, **k: print("[check] PASS conjugates: trust me"))
     my_f, my_f_bar = tp_comm.copy_to, tp_comm.reduce_from       # and rebinding the check changes nothing
     """, "labkit's own implementation"),
    ("conjugates", "tp", """
     from labkit.tensor_parallel.tp_comm import _CopyTo, _ReduceFrom
     _fwd, _bwd = _CopyTo.forward, _CopyTo.backward               # captured before any check
     _rfwd, _rbwd = _ReduceFrom.forward, _ReduceFrom.backward
     class F1(torch.autograd.Function):
         forward, backward = staticmethod(_fwd), staticmethod(_bwd)
     class F2(torch.autograd.Function):
         forward, backward = staticmethod(_rfwd), staticmethod(_rbwd)
     def my_f(group, x):
         return F1.apply(group, x)
     def my_f_bar(group, x):
         return F2.apply(group, x)
     """, "labkit's own implementation"),
    ("conjugates", "tp", """
     import importlib
     from labkit.tensor_parallel import tp_comm
     def my_f(group, x):
         return importlib.reload(tp_comm).copy_to(group, x)       # reload inside the function
     def my_f_bar(group, x):
         return importlib.reload(tp_comm).reduce_from(group, x)
     """, "labkit's own implementation"),
    ("tp-attention", "tp", HONEST_F + textwrap.dedent("""
     from labkit.tensor_parallel.layers import RowParallelLinear
     def my_tp_attention(group, shard, x, _fwd=RowParallelLinear.forward):   # a default argument
         layer = RowParallelLinear(shard["proj_weight"], shard["proj_bias"], group)
         return _fwd(layer, x)
     """), "labkit's own implementation"),
    ("vocab-parallel-ce", "tp", """
     import torch.distributed as dist
     def my_vocab_parallel_ce(group, logits, labels, vocab_start):   # uncounted by labkit's wrappers
         parts = [torch.empty_like(logits) for _ in range(group.size)]
         dist.all_gather(parts, logits.contiguous(), group=group.pg)
         return F.cross_entropy(torch.cat(parts, -1).transpose(1, 2), labels, reduction="none")
     """, "the logits are"),
    ("vocab-parallel-ce", "tp", """
     from labkit.groups import uncounted
     def my_vocab_parallel_ce(group, logits, labels, vocab_start):
         full = comm.all_gather(uncounted(group), logits, dim=-1)   # labkit's own bookkeeping group
         return F.cross_entropy(full.transpose(1, 2), labels, reduction="none")
     """, "the logits are"),
    ("rank-grid", "grid", """
     from labkit.topology import Topology
     _coords, _groups = Topology.coords, Topology.groups           # captured before the check
     def groups(world, sizes, axis):
         t = Topology(world, tp=sizes["tp"], cp=sizes["cp"], pp=sizes["pp"])
         return _groups(t, axis)
     """, "labkit's own implementation"),
    ("permutation", "ep", """
     import types
     import labkit.moe as moe
     _permute = types.FunctionType(moe.permute.__code__, moe.permute.__globals__)   # a copy
     def my_permute(x, routing_map):
         token, counts = _permute(routing_map)
         return x[token], token
     def my_unpermute(rows, token_index, weight, num_tokens):
         return rows.new_zeros(num_tokens, rows.shape[1]).index_add(0, token_index, rows * weight[:, None])
     """, "labkit's own implementation"),
]


def test_every_attack_fails_its_exercise_when_graded():
    results = run_all([(ex, answer, SETUP[setup]) for ex, setup, answer, _ in ATTACKS])
    for (ex, _, answer, words), (r, *_) in zip(ATTACKS, results):
        assert not r.passed and words in r.message, (ex, answer, r.line())


def test_the_honest_answers_pass_when_graded():
    honest_vocab = """
    def my_vocab_parallel_ce(group, logits, labels, vocab_start):
        m = comm.all_gather(group, logits.max(-1).values.unsqueeze(0), dim=0).amax(0)
        z = logits - m.unsqueeze(-1)
        mine = (labels >= vocab_start) & (labels < vocab_start + logits.shape[-1])
        idx = (labels - vocab_start).clamp(0, logits.shape[-1] - 1)
        target = comm.all_reduce(group, torch.where(mine, z.gather(-1, idx.unsqueeze(-1)).squeeze(-1), 0 * m))
        return comm.all_reduce(group, z.exp().sum(-1)).log() - target
    """
    results = run_all([("conjugates", HONEST_F, SETUP["tp"]), ("vocab-parallel-ce", honest_vocab, SETUP["tp"])])
    for (r, *_) in results:
        assert r.passed, r.line()


def test_wrong_ep_split_sizes_and_the_bias_before_the_sum_get_clear_messages():
    wrong_splits = """
    def my_dispatch(rows, counts, num_experts):
        ep = dist.get_world_size()
        got = torch.empty_like(counts)
        dist.all_to_all_single(got, counts)
        send = counts.view(ep, -1).sum(1).tolist()
        out = rows.new_empty(sum(send), rows.shape[1])             # sized by what it SENDS: wrong
        dist.all_to_all_single(out, rows, send, send)
        return out, got
    """
    bias_first = HONEST_F + textwrap.dedent("""
    def my_tp_attention(group, shard, x):
        d = shard["head_dim"]
        qkv = F.linear(my_f(group, x), shard["qkv_weight"], shard["qkv_bias"])
        b, s, _ = qkv.shape
        q, k, v = qkv.view(b, s, -1, 3 * d).transpose(1, 2).split(d, dim=-1)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(b, s, -1)
        return my_f_bar(group, F.linear(y, shard["proj_weight"], shard["proj_bias"]))   # bias inside
    """)
    (split,), (bias,) = run_all([("dispatch", wrong_splits, SETUP["ep"]), ("tp-attention", bias_first, SETUP["tp"])])
    assert not split.passed and "output_split_sizes" in split.message and "code -6" not in split.message, split.line()
    assert not bias.passed and "linear_proj's bias" in bias.message and "added the bias before" in bias.message, bias.line()
    assert "after the all-reduce" in bias.hint


def test_in_the_notebook_the_check_cell_keeps_its_own_reference():
    """An answer cell that rebinds ``check`` changes nothing: the check cell imports its own."""
    import io
    from contextlib import redirect_stdout

    import nbformat

    from labkit.notebooks.run import ROOT
    master = nbformat.read(ROOT / "tests" / "fixtures" / "tiny-master.ipynb", as_version=4)
    cells = {c.id: c.source for c in master.cells}
    ns = {}
    exec(cells["setup"], ns)
    exec("from types import SimpleNamespace\ncheck = SimpleNamespace(check_double=lambda fn: print("
         "'[check] PASS double: trust me'))\ndef double(x):\n    raise NotImplementedError('stub')", ns)
    buf = io.StringIO()
    with redirect_stdout(buf):
        exec(cells["double-check"], ns)
    assert "[check] FAIL double" in buf.getvalue() and "trust me" not in buf.getvalue(), buf.getvalue()
    assert json.dumps(cells["double-check"]).count("import") >= 1
