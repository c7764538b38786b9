"""Checkpoints (labkit.checkpoint): boxes, exact resume, an interrupted save, refusals, DCP's format.

Issue 22. Tier 1: the box arithmetic that maps a rank's element runs (a plan's blocks, a ZeRO
shard) to global offsets. Tier 2 (gloo ranks, float64): a run saved at iteration 2 and resumed on
the same layout with dropout on gives the same losses and gradient norms, bit for bit, as the run
that never stopped; a save killed halfway leaves the previous checkpoint loadable; a truncated,
corrupt or foreign checkpoint is refused before any rank starts, naming the file and the reason;
DCP's own converter reads the files back to the dense weights of one device.
"""
from __future__ import annotations

import math
import random
import shutil

import pytest
import torch
from torch.testing import assert_close

import labkit
from labkit import shard_plan as sp
from labkit.checkpoint import files
from labkit.checkpoint.boxes import boxes, flat_boxes
from labkit.launch_collect import RankFailed
from labkit.reference import train_reference

MODEL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, params_dtype="float64",
             micro_batch_size=2, global_batch_size=8, make_vocab_size_divisible_by=64)


# -- tier 1: boxes ------------------------------------------------------------------------------
def _region(dense, box):
    for d, (o, s) in enumerate(zip(box.offsets, box.sizes)):
        dense = dense.narrow(d, o, s)
    return dense


def test_boxes_tile_any_run_of_any_cut_tensor():
    """Random shapes, cut dims, blocks and element runs: the boxes' local views equal the dense
    tensor at their offsets and cover the run exactly once."""
    rng = random.Random(0)
    for _ in range(300):
        shape = [rng.randint(2, 7) for _ in range(rng.choice([1, 2, 3]))]
        dim = rng.randrange(len(shape))
        a, b, c = sorted(rng.sample(range(shape[dim] + 1), 3))
        blocks = tuple(sp.Block(x, y) for x, y in ((b, c), (a, b)) if y > x)   # out of order on purpose
        entry = sp.ParamShard("w", tuple(shape), dim=dim, blocks=blocks)
        dense = torch.arange(math.prod(shape), dtype=torch.float64).reshape(shape)
        flat = sp.cut(dense, entry).reshape(-1)
        lo = rng.randint(0, flat.numel())
        hi = rng.randint(lo, flat.numel())
        seen = 0
        for box in boxes(entry, lo, hi):
            local = flat[box.at:box.at + math.prod(box.local)].view(box.local)
            local = local.narrow(*box.narrow) if box.narrow else local
            assert torch.equal(local, _region(dense, box)), (shape, dim, blocks, lo, hi, box)
            seen += local.numel()
        assert seen == hi - lo


def test_flat_boxes_split_rows_and_refuse_a_bad_range():
    assert flat_boxes((3, 4), 5, 11) == [((1, 1), (1, 3), 5), ((2, 0), (1, 3), 8)]
    assert flat_boxes((3, 4), 4, 12) == [((1, 0), (2, 4), 4)]
    with pytest.raises(ValueError, match=r"element range \[5, 13\) outside a tensor of 12"):
        flat_boxes((3, 4), 5, 13)


def _one_rank_members():
    """One instance of every DP / ZeRO class on a one-rank group (no processes), over a Linear."""
    from labkit.config import TrainConfig
    from labkit.data_parallel import ddp, fsdp, mixed, zero
    from labkit.groups import Group
    out = []
    for make in (lambda n, g, c, m: ddp.NaiveDataParallel(n, g, c),
                 lambda n, g, c, m: ddp.BucketedDataParallel(n, g, c, 8),
                 lambda n, g, c, m: mixed.MixedPrecisionDataParallel(n, g, c, distributed=True),
                 zero.ZeRO1, zero.ZeRO2, zero.ZeRO3WholeModel, fsdp.ZeRO2Bucketed, fsdp.ZeRO3PerLayer):
        model = torch.nn.Linear(3, 5)
        out.append(make(list(model.named_parameters()), Group("dp", (0,), None), TrainConfig(), model))
    return out


def test_every_dp_class_names_what_its_optimizer_steps():
    """Each DP class's checkpoint_views covers every tensor its optimizer steps, and its runs
    tile each parameter exactly once (one rank: its shard is the whole buffer)."""
    from labkit.checkpoint import holdings
    for member in _one_rank_members():
        table = holdings.runs(member)
        assert {id(p) for p in holdings.optimizer_params(member)} == set(table), type(member).__name__
        covered = {}
        for rs in table.values():
            for name, lo, hi, _ in rs:
                covered[name] = covered.get(name, 0) + hi - lo
        assert covered == {"weight": 15, "bias": 5}, (type(member).__name__, covered)
        assert isinstance(member.grads_sharded, bool)


def test_a_dp_class_without_the_interface_is_refused():
    """The checkpoint asks a DP object through DataParallelMember, never by hasattr: an object of
    another class is refused naming it, and a subclass that leaves out checkpoint_views or
    grads_sharded cannot be built."""
    from types import SimpleNamespace

    from labkit.checkpoint import holdings
    from labkit.data_parallel.ddp import NaiveDataParallel
    from labkit.data_parallel.member import DataParallelMember

    class HomeMadeDP:                        # has everything a hasattr probe would look for
        grads_sharded = False

        def __init__(self, inner):
            self.names, self.params, self.optimizer = inner.names, inner.params, inner.optimizer

        def checkpoint_views(self):
            return {}
    inner = _one_rank_members()[0]
    assert isinstance(inner, NaiveDataParallel)
    engine = SimpleNamespace(plan=None, dp=SimpleNamespace(members=[HomeMadeDP(inner)]))
    with pytest.raises(TypeError, match=r"checkpoint: HomeMadeDP is not a data-parallel class.*"
                                        r"DataParallelMember.*checkpoint_views\(\) and grads_sharded"):
        holdings.tensor_state(engine)

    class NoViews(DataParallelMember):
        grads_sharded = False

    class NoShardedFlag(DataParallelMember):
        def checkpoint_views(self):
            return {}
    with pytest.raises(TypeError, match="abstract method.*checkpoint_views"):
        NoViews()
    with pytest.raises(TypeError, match="abstract method.*grads_sharded"):
        NoShardedFlag()


def test_owned_only_skips_the_blocks_another_rank_writes():
    """A K/V group shared by two TP ranks (GQA, fewer groups than ranks): only the owner writes it."""
    kv_owner = sp.qkv(num_heads=4, num_groups=1, head_dim=2, parts=2, index=0)
    kv_copy = sp.qkv(num_heads=4, num_groups=1, head_dim=2, parts=2, index=1)
    e0 = sp.ParamShard("qkv", (12, 8), blocks=kv_owner)
    e1 = sp.ParamShard("qkv", (12, 8), blocks=kv_copy)
    rows = lambda e: sorted((b.offsets[0], b.offsets[0] + b.sizes[0]) for b in boxes(e, owned_only=True))  # noqa: E731
    assert rows(e0) == [(0, 4), (8, 12)] and rows(e1) == [(4, 8)]   # q halves; K/V rows once


# -- tier 2 ------------------------------------------------------------------------------------
RESUME = dict(MODEL, tensor_model_parallel_size=2, sequence_parallel=True, use_distributed_optimizer=True,
              hidden_dropout=0.1, attention_dropout=0.1)


def test_resume_on_the_same_layout_is_bit_exact_with_dropout(tmp_path):
    """TP2 + SP x DP2, distributed optimizer, dropout on: save at 2 (in the background), resume to 4."""
    whole = labkit.train(world_size=4, steps=4, log_interval=0, **RESUME)
    first = labkit.train(world_size=4, steps=2, log_interval=0, save=tmp_path, async_save=True, **RESUME)
    assert first.losses == whole.losses[:2]
    rest = labkit.train(world_size=4, steps=4, log_interval=0, load=tmp_path, **RESUME)
    assert rest.ranks[0]["start"] == 2 and len(rest.losses) == 2
    assert rest.losses == whole.losses[2:], "losses after the resume differ (bit for bit)"
    assert rest.grad_norms == whole.grad_norms[2:]
    rec = first.ranks[0]["checkpoint"][0]
    assert rec["iteration"] == 2 and rec["async"] and rec["write_s"] > 0 and rec["blocking_s"] > 0


def test_each_value_is_written_once(tmp_path):
    """The pieces of all ranks add up to weights + two AdamW moments of the dense model, no more:
    TP replicas, DP replicas and the tied embedding's copy on the last stage are written once."""
    kw = dict(MODEL, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    res = labkit.train(world_size=4, steps=1, log_interval=0, save=tmp_path, **kw)
    params = sum(p.numel() for p in labkit.model.GPT(res.config.model_config()).parameters())
    assert sum(r["checkpoint"][0]["bytes"] for r in res.ranks) == 3 * params * 8
    from labkit.calc.goodput import checkpoint_bytes    # the calculator counts the same bytes
    model, par = res.config.megatron_view(4)
    fp64 = labkit.calc.PrecisionConfig(8, 8, 16, 8, "fp64")
    assert checkpoint_bytes(model, par, fp64)["total"] == 3 * params * 8


def test_dcp_reads_the_files_back_to_one_devices_weights(tmp_path):
    """DCP's own converter (no labkit code) turns the checkpoint of a TP2 x PP2 run into a plain
    state dict: its weights equal the single-device model after the same 2 iterations."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    kw = dict(MODEL, tensor_model_parallel_size=2, pipeline_model_parallel_size=2, zero_stage=1)
    labkit.train(world_size=4, steps=2, log_interval=0, save=tmp_path / "ck", **kw)
    dcp_to_torch_save(tmp_path / "ck" / "iter_0000002", tmp_path / "plain.pt")
    state = torch.load(tmp_path / "plain.pt", weights_only=False)
    model = train_reference(world_size=4, steps=2, return_model=True, **kw)["model"]
    for name, p in model.named_parameters():
        assert_close(state[f"model.{name}"], p.detach(), rtol=1e-12, atol=1e-12, msg=name)


def test_an_interrupted_save_leaves_the_previous_checkpoint_usable(tmp_path):
    from labkit.debug import crash_during_save
    kw = dict(MODEL, tensor_model_parallel_size=2)
    with pytest.raises(RankFailed, match="rank 1 failed") as err:
        labkit.train(world_size=2, steps=4, log_interval=0, save=tmp_path, save_interval=2,
                     probe=crash_during_save(4, rank=1), **kw)
    assert "exited with code 17" in str(err.value)
    assert (tmp_path / files.TRACKER).read_text() == "2"
    assert (tmp_path / "iter_0000004.partial").is_dir() and not (tmp_path / "iter_0000004").exists()
    with pytest.raises(ValueError, match=r"iter_0000004.partial: unfinished checkpoint"):
        labkit.train(world_size=2, steps=5, load=tmp_path / "iter_0000004.partial", **kw)
    rest = labkit.train(world_size=2, steps=4, log_interval=0, load=tmp_path, **kw)
    assert_close(torch.tensor(rest.losses), torch.tensor(train_reference(world_size=2, steps=4, **kw)[2:]),
                 rtol=0, atol=1e-11)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("ck")
    labkit.train(world_size=1, steps=1, log_interval=0, save=path, **MODEL)
    return path


def _copy(saved, tmp_path):
    shutil.copytree(saved, tmp_path / "ck")
    return tmp_path / "ck", next((tmp_path / "ck" / "iter_0000001").glob("__0_*.distcp"))


def _refused(load, match, **kw):
    with pytest.raises(ValueError, match=match):
        labkit.train(world_size=1, steps=3, load=load, **{**MODEL, **kw})


def test_truncated_and_corrupt_files_are_refused_naming_them(saved, tmp_path, monkeypatch):
    import labkit.launcher
    monkeypatch.setattr(labkit.launcher, "launch", lambda *a, **k: pytest.fail("launched"))
    ck, data = _copy(saved, tmp_path)
    size = data.stat().st_size
    with open(data, "r+b") as f:
        f.truncate(size // 2)
    _refused(ck, rf"{data.name}: truncated or grown: {size // 2} bytes, the manifest says {size}")
    ck2, data2 = _copy(saved, tmp_path / "b")
    raw = bytearray(data2.read_bytes())
    raw[size // 2] ^= 0xFF
    data2.write_bytes(bytes(raw))
    _refused(ck2, rf"{data2.name}: corrupt: its sha256 differs")
    (ck2 / files.TRACKER).write_text("two")
    _refused(ck2, r"latest_checkpointed_iteration.txt: corrupt tracker")


def test_another_model_or_vocabulary_is_refused_with_the_fields(saved, monkeypatch):
    import labkit.launcher
    monkeypatch.setattr(labkit.launcher, "launch", lambda *a, **k: pytest.fail("launched"))
    _refused(saved, r"labkit.json: incompatible checkpoint, another model: hidden_size 32 in the "
                    r"checkpoint, 64 here", hidden_size=64)
    _refused(saved, r"vocab_size 256 in the checkpoint, 384 here.*make_vocab_size_divisible_by",
             make_vocab_size_divisible_by=384)
    with pytest.raises(ValueError, match=r"at iteration 1 and steps is 1: nothing to train"):
        labkit.train(world_size=1, steps=1, load=saved, **MODEL)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="save_interval must be a positive integer"):
        labkit.train(world_size=1, steps=2, save="x", save_interval=0, **MODEL)
    with pytest.raises(ValueError, match="save_interval 2 without save"):
        labkit.train(world_size=1, steps=2, save_interval=2, **MODEL)
