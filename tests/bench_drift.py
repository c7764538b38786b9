"""Benchmark: the confusion matrix of ``labkit drift`` (issue 32, item 4). Not collected by pytest.

    PYTHONPATH=. python tests/bench_drift.py run --clean 50        # the runs -> data/drift_runs.json
    PYTHONPATH=. python tests/bench_drift.py summarize             # verdicts -> data/drift_confusion.json

``run``: every planted bug of ``labkit.debug.BUGS`` on its own layout in bf16 against the clean
one-device bf16 run of the same seed; then clean pairs (a family's layout against one device, bf16)
on seeds 1000.. that the envelopes (seeds 0-3) never saw, the families taken in turn. Raw losses and
grad norms of both runs are stored, written after each pair (a run stopped early keeps what it did).
``summarize``: each pair through ``labkit.drift.decide`` against data/envelopes.json: a bug flagged
outside is a true positive, a clean pair flagged outside a false alarm.
"""
from __future__ import annotations

import json
import sys
import time

STEPS, SEED, PRECISION = 20, 0, "bf16"


def _pair(world, kw, seed, bug=None):
    from labkit.drift.layouts import one_device
    from labkit.drift.measure import run
    t0 = time.perf_counter()
    par = run(world, kw, PRECISION, seed, STEPS, bug=bug)
    one = run(1, one_device(kw), PRECISION, seed, STEPS)
    return {"a": {"losses": par["losses"], "grad_norms": par["grad_norms"]},
            "b": {"losses": one["losses"], "grad_norms": one["grad_norms"]},
            "seconds": round(time.perf_counter() - t0, 1)}


def run_all(clean: int, out: str = "data/drift_runs.json") -> None:
    from labkit.debug.bugs import BUGS
    from labkit.drift.layouts import FAMILIES, MODEL, family_of
    from labkit.drift.measure import provenance
    import os
    res = {"provenance": provenance(f"python tests/bench_drift.py run --clean {clean}", [SEED], STEPS),
           "precision": PRECISION, "bugs": [], "clean": []}
    if os.path.exists(out):                 # resume: keep the pairs a stopped run measured
        with open(out) as f:
            res = json.load(f)
        res["provenance"].setdefault("resumed", []).append(provenance("resumed", [SEED], STEPS)["date"])
    done = {b["name"] for b in res["bugs"]}

    def save():
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
    for name, bug in BUGS.items():
        if name in done:
            continue
        kw = {**MODEL, **bug.layout}
        fam = family_of((bug.world_size, kw))
        res["bugs"].append({"name": name, "family": fam, "world_size": bug.world_size, "layout": bug.layout,
                            "seed": SEED, **_pair(bug.world_size, kw, SEED, bug=name)})
        print(f"bug {name} ({fam}): {res['bugs'][-1]['seconds']} s", flush=True)
        save()
    names = list(FAMILIES)
    for i in range(len(res["clean"]), clean):
        fam = names[i % len(names)]
        world, layout, model = FAMILIES[fam]
        res["clean"].append({"family": fam, "seed": 1000 + i,
                             **_pair(world, {**MODEL, **model, **layout}, 1000 + i)})
        print(f"clean {fam} seed {1000 + i}: {res['clean'][-1]['seconds']} s", flush=True)
        save()


def summarize(runs: str = "data/drift_runs.json", envelopes: str = "data/envelopes.json",
              out: str = "data/drift_confusion.json") -> dict:
    from labkit.drift.decide import decide, load_envelopes, series_from_json
    with open(runs) as f:
        res = json.load(f)
    env = load_envelopes(envelopes)

    def verdict(p):
        return decide(series_from_json(p["a"]), series_from_json(p["b"]), p["family"], res["precision"], env)
    unjudged = [p.get("name", f"clean {p['family']} seed {p.get('seed')}") for p in res["bugs"] + res["clean"]
                if "band" not in env["cells"].get(p["family"], {}).get(res["precision"], {})]
    bugs = [{"name": p["name"], "family": p["family"], **_v(verdict(p))} for p in res["bugs"] if p["name"] not in unjudged]
    clean = [{"family": p["family"], "seed": p["seed"], **_v(verdict(p))} for p in res["clean"]
             if f"clean {p['family']} seed {p['seed']}" not in unjudged]
    tp = sum(not b["within"] for b in bugs)
    fa = sum(not c["within"] for c in clean)
    summary = {"provenance": {**res["provenance"], "summarized_with": envelopes},
               "precision": res["precision"],
               "matrix": {"bugs flagged outside": tp, "bugs within (missed)": len(bugs) - tp,
                          "clean flagged outside (false alarms)": fa, "clean within": len(clean) - fa},
               "false_alarm_rate": fa / len(clean) if clean else None,
               "run_seconds": round(sum(p["seconds"] for p in res["bugs"] + res["clean"]), 1),
               "unjudged (no envelope measured)": unjudged, "bugs": bugs, "clean": clean}
    with open(out, "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    print(json.dumps(summary["matrix"]), f"false alarm rate {summary['false_alarm_rate']}")
    return summary


def _v(v) -> dict:
    return {"within": v.within, "left_at": v.left_at, "channel": v.channel, "worst": v.worst, "text": v.text()}


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        run_all(int(sys.argv[sys.argv.index("--clean") + 1]) if "--clean" in sys.argv else 50)
    else:
        summarize()
