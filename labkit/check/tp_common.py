"""What the Tensor-parallel lab's checks share: tolerances, the dense MLP, how a TP block is judged."""
from __future__ import annotations

from . import describe_mismatch, report

ATOL = RTOL = 1e-10  # float64: only summation order differs
TP_COMM = "labkit.tensor_parallel.tp_comm"
OWN_CONJUGATES = (f"{TP_COMM}:copy_to", f"{TP_COMM}:reduce_from", f"{TP_COMM}:_CopyTo.forward",
                  f"{TP_COMM}:_CopyTo.backward", f"{TP_COMM}:_ReduceFrom.forward",
                  f"{TP_COMM}:_ReduceFrom.backward")
GRADS = ("fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")


def dense_mlp(h: int, seed: int):
    """The dense MLP (non-zero biases, so a bias added t times shows), x and dy [2, 4, h]: float64."""
    import torch

    from labkit.model import MLP, GPTConfig
    torch.manual_seed(seed)
    mlp = MLP(GPTConfig(hidden_size=h, num_attention_heads=1)).double()
    with torch.no_grad():
        mlp.linear_fc1.bias.normal_()
        mlp.linear_fc2.bias.normal_()
    x = torch.randn(2, 4, h, dtype=torch.float64)
    dy = torch.randn(2, 4, h, dtype=torch.float64)
    return mlp, x, dy


def _mlp_shard(mlp, t: int, r: int) -> dict:
    f = mlp.linear_fc1.weight.shape[0] // t
    rows = slice(r * f, (r + 1) * f)
    return {"fc1_weight": mlp.linear_fc1.weight[rows], "fc1_bias": mlp.linear_fc1.bias[rows],
            "fc2_weight": mlp.linear_fc2.weight[:, rows], "fc2_bias": mlp.linear_fc2.bias}


class MLPWith:
    """A TP MLP made of the student's f and f-bar: f -> fc1 (columns) -> GeLU -> fc2 (rows) -> f-bar -> + b."""

    def __init__(self, f, f_bar):
        self.f, self.f_bar = f, f_bar

    def __call__(self, group, shard, x):
        import torch.nn.functional as F
        x = self.f(group, x)                                               # f: enter the region
        y = F.gelu(F.linear(x, shard["fc1_weight"], shard["fc1_bias"]))    # [b, s, 4h/t]
        z = self.f_bar(group, F.linear(y, shard["fc2_weight"]))            # f-bar: sum the partials
        return z + shard["fc2_bias"]


def judge_mlp(title: str, results, expected, t: int, hints: dict, grads: tuple = GRADS):
    """Compare a TP MLP's ranks with the dense MLP; the kind of error picks ``hints[kind]``.
    Returns a failed CheckResult, or None when everything matches."""
    import torch
    for r, out in enumerate(results):
        problem = describe_mismatch(out["out"], expected[r]["out"], ATOL, RTOL, what=f"rank {r}, forward output: ")
        if problem:
            return report(title, False, problem, hints["forward"])
    summed = sum(torch.as_tensor(out["input grad"]) for out in results)
    wrong, kinds = [], set()
    for what in ("input grad",) + tuple(f"{k} grad" for k in grads):   # every gradient, named
        got, want = results[0][what], expected[0][what]
        if got is None:
            wrong.append(f"{what} is None")
            kinds.add("other")
        elif describe_mismatch(got, want, ATOL, RTOL) is None:
            continue
        elif describe_mismatch(got, t * want, ATOL, RTOL) is None:
            wrong.append(f"{what} = {t} x the dense gradient")
            kinds.add("times t")
        elif what == "input grad" and describe_mismatch(summed, want, ATOL, RTOL) is None:
            wrong.append(f"{what} is a partial sum (summed over the {t} ranks it equals the dense one)")
            kinds.add("partial")
        else:
            wrong.append(describe_mismatch(got, want, ATOL, RTOL, what=f"{what}: "))
            kinds.add("other")
    if wrong:
        kind = kinds.pop() if len(kinds) == 1 else "other"
        return report(title, False, "forward output is right; rank 0: " + "; ".join(wrong), hints[kind])
    return None
