"""How good is the step-time model on runs it has not seen (chapter "Planning a run").

The honest number is **leave-one-source-out** (LOSO): for each source, fit the constants on every
other source and predict this one; no constant is ever judged on runs it was fitted on. A source
is one paper or one repository (``runs.SOURCES``). Per source: n, median and mean |error|, signed
bias, and a bootstrap 95% interval of the median |error| (the source's runs resampled with
replacement, a fixed seed). The in-sample ("fitted") figure, every source in the fit, comes second.
The frozen held-out set (data/published_runs_heldout.csv) is predicted once, with the constants
fitted on every run of the main table.

``python -m labkit.calc.evaluate`` recomputes the leave-one-source-out and fitted figures (several
minutes of pure Python: one fit per source) into ``EVALUATION`` (data/step_time_evaluation.json),
which the chapter reads; tests/test_calc_perf.py checks the file against the model. The held-out
figures in it were computed once (``--heldout``), by the model of the commit they name, and are kept.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from . import runs

EVALUATION = runs.DATA.with_name("step_time_evaluation.json")


def median(xs: list) -> float:
    a = sorted(xs)
    mid = len(a) // 2
    return a[mid] if len(a) % 2 else (a[mid - 1] + a[mid]) / 2


def bootstrap_median(errs: list, draws: int = 1000, seed: int = 0, level: float = 0.95) -> tuple:
    """(low, high) percentile interval of the median |error| over ``draws`` resamples."""
    rng = random.Random(seed)
    a = [abs(e) for e in errs]
    meds = sorted(median([rng.choice(a) for _ in a]) for _ in range(draws))
    lo = int((1 - level) / 2 * draws)
    return meds[lo], meds[min(draws - 1, draws - 1 - lo)]


def describe(errs: list) -> dict:
    """n, median / mean |error|, signed bias and the bootstrap interval of the median."""
    s = runs.summary(errs)
    lo, hi = bootstrap_median(errs)
    return {"n": s["n"], "median": s["median_abs"], "mean": s["mean_abs"], "bias": s["mean_signed"],
            "max": s["max_abs"], "median_lo": lo, "median_hi": hi}


def loso(table: list, sources=runs.SOURCES) -> dict:
    """{source: (errors of its runs with the constants fitted on the other sources, fitted values)}."""
    out = {}
    for s in sources:
        k, values = runs.fit(table, sources=tuple(x for x in sources if x != s))
        out[s] = ([e for r, e in zip(table, runs.errors(table, k)) if r["row"]["source"] == s], values)
    return out


def evaluate(table: list | None = None, heldout: bool = True) -> dict:
    """Everything the chapter reports, as plain data (JSON-ready)."""
    table = table or runs.load_runs()
    left = loso(table)
    k_all, v_all = runs.fit(table)
    fitted = runs.errors(table, k_all)
    res = {"loso": {s: describe(e) for s, (e, _) in left.items()},
           "loso_constants": {s: v for s, (_, v) in left.items()},
           "fitted": {s: describe([e for r, e in zip(table, fitted) if r["row"]["source"] == s]) for s in left},
           "constants": v_all,
           "runs": [{"run_id": r["row"]["run_id"], "source": r["row"]["source"], "measured": r["measured"],
                     "loso": None, "fitted": e} for r, e in zip(table, fitted)]}
    by_id = {r["run_id"]: r for r in res["runs"]}
    for s, (errs, _) in left.items():
        for r, e in zip([r for r in table if r["row"]["source"] == s], errs):
            by_id[r["row"]["run_id"]]["loso"] = e
    every = [r["loso"] for r in res["runs"]]
    res["loso_overall"] = describe(every)
    res["fitted_overall"] = describe(fitted)
    if heldout:
        held, refused = [], []
        for r in runs.load_runs(runs.HELDOUT):
            try:
                runs.predict(r, k_all, True)
                held.append(r)
            except ValueError as err:      # a row whose stated layout breaks a rule: reported, not dropped
                refused.append({"run_id": r["row"]["run_id"], "source": r["row"]["source"], "why": str(err)})
        herr = runs.errors(held, k_all)
        res["heldout_sha256"] = runs.heldout_sha256()
        res["heldout"] = {s: describe([e for r, e in zip(held, herr) if r["row"]["source"] == s])
                          for s in dict.fromkeys(r["row"]["source"] for r in held)}
        res["heldout_overall"] = describe(herr)
        res["heldout_refused"] = refused
        res["heldout_runs"] = [{"run_id": r["row"]["run_id"], "source": r["row"]["source"],
                                "measured": r["measured"], "error": e, "vp_assumed": r["vp_assumed"],
                                "vp_range": runs.vp_range(r["row"], k_all) if r["vp_assumed"] else None}
                               for r, e in zip(held, herr)]
    return res


def load(path=EVALUATION) -> dict:
    return json.loads(Path(path).read_text())


HELDOUT_KEYS = ("heldout_sha256", "heldout", "heldout_overall", "heldout_refused", "heldout_runs", "heldout_model_commit")


def write(path=EVALUATION, heldout: bool = False) -> dict:
    """Recompute the leave-one-source-out and fitted figures into ``path``. The held-out set's
    figures are kept from the file unless ``heldout`` (it is evaluated once: the stored figures name
    the commit of the model that made them)."""
    old = load(path) if Path(path).exists() else {}
    res = evaluate(heldout=heldout)
    if not heldout:
        res.update({k: old[k] for k in HELDOUT_KEYS if k in old})
    Path(path).write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    return res


if __name__ == "__main__":   # python -m labkit.calc.evaluate [--heldout]
    import sys
    r = write(heldout="--heldout" in sys.argv[1:])
    for name in ("loso_overall", "fitted_overall", "heldout_overall"):
        if name in r:
            print(name, {k: round(v, 4) for k, v in r[name].items()})
