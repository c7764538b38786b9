"""Tier 1 (no processes): Topology is a pure value with Megatron's tp-cp-ep-dp-pp order."""
import itertools
import re

import pytest

from labkit import Topology


def test_issue_example_world16_tp2_pp4():
    t = Topology(16, tp=2, pp=4)
    assert t.dp == 2
    assert t.groups("tp") == [[2 * i, 2 * i + 1] for i in range(8)]
    assert t.groups("dp")[:4] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert t.groups("pp") == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert t.coords(13) == {"tp": 1, "cp": 0, "ep": 0, "dp": 0, "pp": 3}


@pytest.mark.parametrize("world,tp,pp,cp", [(8, 2, 2, 1), (16, 2, 2, 2), (12, 3, 1, 2), (1, 1, 1, 1)])
def test_coords_roundtrip_and_groups_partition(world, tp, pp, cp):
    t = Topology(world, tp=tp, pp=pp, cp=cp)
    # rank = tp + tp*(cp + cp*(dp + dp*pp)): tp fastest, pp slowest
    for r in range(world):
        c = t.coords(r)
        assert r == c["tp"] + tp * (c["cp"] + cp * (c["dp"] + t.dp * c["pp"]))
    for axis, size in (("tp", tp), ("pp", pp), ("cp", cp), ("dp", t.dp), ("dp_cp", t.dp * cp), ("mp", tp * pp)):
        groups = t.groups(axis)
        assert all(len(g) == size for g in groups)
        assert sorted(itertools.chain(*groups)) == list(range(world))  # a partition
        for g in groups:  # members differ only along the axis
            others = {k for k in ("tp", "cp", "dp", "pp") if k not in {"dp_cp": ("dp", "cp"), "mp": ("tp", "pp")}.get(axis, (axis,))}
            assert len({tuple(t.coords(r)[k] for k in sorted(others)) for r in g}) == 1


def test_expert_parallel_subdivides_dp():
    t = Topology(8, tp=2, ep=2)
    assert t.dp == 4
    assert t.groups("ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert [t.coords(r)["dp"] for r in (0, 2, 4, 6)] == [0, 1, 2, 3]


@pytest.mark.parametrize("kwargs,words", [
    (dict(world_size=6, tp=4), ["world_size 6", "tp*pp*cp", "4"]),
    (dict(world_size=8, tp=2, pp=3), ["world_size 8", "6"]),
    (dict(world_size=8, tp=2, ep=3), ["data-parallel size 4", "ep 3"]),
    (dict(world_size=0), ["world_size must be a positive integer"]),
    (dict(world_size=4, tp=0), ["tp must be a positive integer"]),
])
def test_invalid_layouts_name_the_numbers(kwargs, words):
    with pytest.raises(ValueError) as e:
        Topology(**kwargs)
    for w in words:
        assert w in str(e.value)


def test_frozen_and_bad_queries():
    t = Topology(4, tp=2)
    with pytest.raises(Exception):
        t.tp = 4
    with pytest.raises(ValueError, match="rank must be in"):
        t.coords(4)
    with pytest.raises(ValueError, match="unknown axis"):
        t.groups("dim")
    assert t.group_of("tp", 3) == [2, 3]


def test_one_integer_check_names_the_field_and_the_value():
    """labkit.validate: the one check every count goes through (topology, config, calc, schedules)."""
    from labkit.validate import int_at_least, positive_int
    assert positive_int("tp", 2) == 2 and positive_int("gbs", None, allow_none=True) is None
    for bad in (0, -1, True, 1.0, "2", None):
        with pytest.raises(ValueError, match=rf"^tp must be a positive integer, got {re.escape(repr(bad))}$"):
            positive_int("tp", bad)
    with pytest.raises(ValueError, match=r"^save_interval must be a positive integer \(iterations\), got 0$"):
        positive_int("save_interval", 0, note=" (iterations)")
    assert int_at_least("chunk", 0, 0) == 0
    with pytest.raises(ValueError, match=r"^chunk must be an integer >= 0, got -1$"):
        int_at_least("chunk", -1, 0)
