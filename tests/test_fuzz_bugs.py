"""Tier 2, slow: from a cold start the fuzzer finds each planted composition bug within a stated
budget of drawn layouts, shrinks it to its minimal layout, and ``labkit diverge`` names the place.

Issue 31, "Done when". Each bug of ``labkit.debug.composition`` is a no-op on every single axis
(tests/test_fuzz.py proves it without a run); here ``labkit.fuzz.fuzz(seed, layouts=budget,
bug=name)`` draws layouts of the whole space (world 1-8) with that bug planted in every labkit run.
The seed is fixed per bug; the median budget over seeds 0-4 is in the README ("labkit fuzz"). The
layouts drawn depend on (seed, budget) together (Hypothesis's seeded stream is not prefix-stable).
"""
from __future__ import annotations

import os

import pytest

from labkit.config import train_config
from labkit.debug.bugs import BUGS
from labkit.debug.composition import WHEN
from labkit.fuzz.run import fuzz

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("LABKIT_FUZZ"), reason="minutes of runs: the fuzz step of "
                                 ".ci/run runs these (LABKIT_FUZZ=1)")]

# bug, seed, budget (layouts drawn, refused ones included)
CASES = [("vocab_loss_gathered_logits", 4, 6), ("sp_norm_grads_not_summed_with_cp", 5, 8),
         ("vpp_embedding_grad_not_summed", 3, 14), ("cp_grad_scale_one_over_dp", 0, 10),
         ("etp_expert_grads_wrong_group", 9, 8), ("dist_opt_shard_off_padded_vocab", 0, 8)]


@pytest.mark.parametrize("name,seed,budget", CASES, ids=[c[0] for c in CASES])
def test_each_composition_bug_is_found_shrunk_and_named(name, seed, budget, tmp_path):
    r = fuzz(seed=seed, layouts=budget, bug=name, stop_at_first=True, out=str(tmp_path))
    assert r.findings, f"{name}: not found in {budget} layouts from seed {seed}: {r.counts()}"
    f = r.findings[0]
    bug = BUGS[name]
    cfg = train_config(**f.shrunk["config"])
    assert WHEN[name](cfg, cfg.topology(f.shrunk["world_size"])), f"{name}: shrunk to a layout it does not act on: {f}"
    assert f.shrunk["world_size"] == bug.world_size, f"{name}: not minimal: {f}"
    assert f.index <= budget and f.path is not None and f.command.endswith(f.path)
    want = bug.expect                      # where diverge finds it on the bug's own layout
    assert f.divergence is not None and "first divergence: iteration 0, " + want["phase"] in f.divergence, str(f)
    if name != "dist_opt_shard_off_padded_vocab":        # there: whichever tensor holds a shard boundary
        assert want["layer"] in f.divergence and want["tensor"] in f.divergence, str(f)
    if want["collective"] is not None:
        assert f"collective: {want['collective']}" in f.divergence, str(f)


def test_clean_labkit_gives_no_new_finding_in_the_same_budgets():
    """The same (seed, budget) draws as above, no bug planted: nothing new (known.py's findings may match)."""
    for _, seed, budget in CASES:         # a pool depends on (seed, budget): Hypothesis's stream is not prefix-stable
        r = fuzz(seed=seed, layouts=budget, diverge=False)
        assert not r.findings, "\n".join(str(f) for f in r.findings)
