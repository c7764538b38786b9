"""Tier 1: labkit's import graph is layered and acyclic (README, "Design"; DESIGN "labkit v2").

Every import counts, the lazy ones inside functions included (read from the source with ast, so
nothing is imported). Rules: a module imports only from its own layer or below; the strategy
folders (layer 2) never import each other; the graph has no cycle; no module exceeds 300 lines.
"""
from __future__ import annotations

import ast
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "labkit"

# layer of each module, by the longest matching dotted prefix
LAYERS = {
    # L0 pure: rules, layouts, calculators, schedules as data
    "labkit.topology": 0, "labkit.config": 0, "labkit.precision_rules": 0, "labkit.param_attrs": 0, "labkit.calc": 0,
    "labkit.spec": 0, "labkit.roles": 0, "labkit.validate": 0, "labkit.shard_plan": 0, "labkit.pipeline_parallel.placement": 0,
    "labkit.pipeline_parallel.schedules": 0, "labkit.pipeline_parallel.simulate": 0,
    "labkit.pipeline_parallel.p2p_plan": 0, "labkit.figures.style": 0,
    # L1 runtime: processes, groups, collectives, the dense model, data
    "labkit.launcher": 1, "labkit.launch_rank": 1, "labkit.launch_collect": 1, "labkit.groups": 1, "labkit.comm": 1,
    "labkit.data": 1, "labkit.indexed_dataset": 1, "labkit.model": 1, "labkit.moe": 1,
    "labkit.modules": 1, "labkit.moe_stats": 1, "labkit.precision": 1, "labkit.recompute": 1,
    "labkit.fp8": 1, "labkit.torchrun_store": 1,
    # L2 one folder per parallelism
    "labkit.tensor_parallel": 2, "labkit.context_parallel": 2, "labkit.expert_parallel": 2,
    "labkit.pipeline_parallel": 2, "labkit.data_parallel": 2,
    # L3 composition
    "labkit.parallelize": 3, "labkit.training": 3, "labkit.restart": 3, "labkit.reference": 3, "labkit.preflight": 3,
    "labkit.native": 3, "labkit.checkpoint": 3, "labkit.megatron": 3,
    # L4 tools
    "labkit.measure": 4, "labkit.check": 4, "labkit.megatron_bridge": 4, "labkit.widgets": 4,
    "labkit.notebooks": 4, "labkit.__main__": 4, "labkit.gpu_check": 4, "labkit.experiments": 4,
    "labkit.figures": 4, "labkit.debug": 4, "labkit.interop": 4, "labkit.fuzz": 4, "labkit.drift": 4,
    "labkit.debug.stacks": 1,   # the launcher's hang report reads stack dumps with it (pure Python)
}
STRATEGIES = ("tensor_parallel", "context_parallel", "expert_parallel", "pipeline_parallel",
              "data_parallel")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def layer(mod: str) -> int | None:
    best = max((k for k in LAYERS if mod == k or mod.startswith(k + ".")), key=len, default=None)
    return None if best is None else LAYERS[best]


def imports(mod: str, path: Path, known: set[str]) -> set[str]:
    """labkit modules ``mod`` imports, anywhere in the file (the package facade excluded)."""
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:          # labkit.calc.comm.x -> labkit.calc.comm
                name = name.rpartition(".")[0]
            if name and name != "labkit" and name != mod:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(m, p, set(mods)) for m, p in mods.items() if m != "labkit"}


def violations(g: dict[str, set[str]]) -> list[str]:
    """Upward imports and imports between strategy folders in graph ``g``."""
    bad = []
    for mod, deps in g.items():
        for dep in deps:
            if layer(dep) is not None and layer(mod) is not None and layer(dep) > layer(mod):
                bad.append(f"{mod} (L{layer(mod)}) imports {dep} (L{layer(dep)})")
            a, b = mod.split("."), dep.split(".")
            if (len(a) > 1 and len(b) > 1 and a[1] in STRATEGIES and b[1] in STRATEGIES
                    and a[1] != b[1] and layer(mod) == 2 and layer(dep) == 2):
                bad.append(f"strategy {a[1]} imports strategy {b[1]}: {mod} -> {dep}")
    return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk of ``g`` meets."""
    state, stack, found = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(g.get(m, ())):
            if state.get(d) == "open":
                found.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m)
    return found


def test_every_module_has_a_layer():
    missing = [m for m in graph() if layer(m) is None]
    assert not missing, f"modules with no layer (add them to LAYERS and to README, Design): {missing}"


def test_imports_go_only_downward_and_strategies_stay_apart():
    bad = violations(graph())
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_checks_can_fail():
    """Planted violations are caught, so a green run means something."""
    g = {k: set(v) for k, v in graph().items()}
    g["labkit.comm"].add("labkit.training")                     # runtime imports composition
    g["labkit.tensor_parallel.plan"].add("labkit.pipeline_parallel.stage")  # strategy -> strategy
    g["labkit.groups"].add("labkit.comm")                       # comm imports groups: a cycle
    bad = violations(g)
    assert any("labkit.comm (L1) imports labkit.training" in b for b in bad)
    assert any("strategy tensor_parallel imports strategy pipeline_parallel" in b for b in bad)
    assert any("labkit.groups" in c and "labkit.comm" in c for c in cycles(g))


def test_modules_at_most_300_lines():
    long = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 300}
    assert not long, f"split these by concept: {long}"
