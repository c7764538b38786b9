"""Check for the Pipeline-parallel lab's second exercise: the 1F1B loop of one rank over send/recv.

``student_fn(stage, group, m)`` runs one iteration of Megatron's non-interleaved 1F1B
(``forward_backward_pipelining_without_interleaving``) on this rank: ``m`` microbatches, each
``stage.forward(mb, x)`` then, later, ``stage.backward(mb, grad)``, moving activations to the next
rank and gradients to the previous one with ``labkit.comm.send`` / ``recv``, and, in the steady
state, ``labkit.comm.send_recv`` (Megatron's ``send_forward_recv_backward`` and
``send_backward_recv_forward``: blocking sends facing each other would deadlock). The
:class:`Stage` holds this rank's part of a float64 GPT (one layer per rank, as
``labkit.pipeline_parallel.stage`` cuts it; untied embeddings), feeds its own microbatches and
counts what it holds. The judge compares every parameter's gradient with the dense model's
(one device, all microbatches), checks that each rank held at most min(p - rank, m) microbatches
at once (1F1B's memory, Narayanan et al. 2021, Sec. 2.2.1, where GPipe holds m), and that the
ranks exchanged exactly one activation forward and one gradient backward per microbatch and
boundary, point-to-point only, counted below labkit. labkit's schedules and executor raise.
"""
from __future__ import annotations

from . import describe_mismatch, report
from .hints import asker
from .spec import Spec, failed, ranks, run
from .compare import far

H, S, MBS = 32, 16, 2
PPL = "labkit.pipeline_parallel"
OWN = (f"{PPL}.executor:run_schedule", f"{PPL}.executor:PipelineRunner.forward_backward",
       f"{PPL}.schedules:one_f_one_b", f"{PPL}.schedules:warmup_1f1b", f"{PPL}.schedules:gpipe")


def _model(p: int, seed: int):
    from ..model import GPT, GPTConfig
    cfg = GPTConfig(num_layers=p, hidden_size=H, num_attention_heads=4, seq_length=S,
                    untie_embeddings_and_output_weights=True)
    return GPT(cfg, seed=seed).double()


def _batches(m: int, seed: int):
    from .. import data
    x, y = data.get_batch(data.load_tokens(), 0, MBS * m, S, seed)
    return list(zip(x.split(MBS), y.split(MBS)))


class Stage:
    """This rank's part of the model and its microbatches; ``forward``/``backward`` one microbatch."""

    def __init__(self, rank: int, p: int, m: int, seed: int):
        self.rank, self.size, self.m = rank, p, m
        self.is_first, self.is_last = rank == 0, rank == p - 1
        self.part = _model(p, seed).part([rank], pre_process=self.is_first, post_process=self.is_last)
        self.batches = _batches(m, seed)
        self.saved, self.done, self.peak, self.order = {}, set(), 0, []

    def forward(self, mb: int, x=None):
        """Run microbatch ``mb`` forward. ``x``: the activation received from the previous rank
        (None on the first). Returns the activation to send on (None on the last rank)."""
        if mb in self.saved or mb in self.done or not 0 <= mb < self.m:
            raise ValueError(f"rank {self.rank}: forward of microbatch {mb} twice, or out of range 0..{self.m - 1}")
        tokens, labels = self.batches[mb]
        if not self.is_first:
            if x is None:
                raise ValueError(f"rank {self.rank}: forward({mb}) needs the activation from rank {self.rank - 1}")
            x = x.detach().requires_grad_()
        out = self.part(tokens if self.is_first else x, labels if self.is_last else None)
        if self.is_last:
            out = out / self.m                                   # the mean loss over the batch
        self.saved[mb] = (x, out)
        self.peak = max(self.peak, len(self.saved))
        self.order.append(["F", mb])
        return None if self.is_last else out.detach()

    def backward(self, mb: int, grad=None):
        """Run microbatch ``mb`` backward. ``grad``: the gradient received from the next rank (None on
        the last). Returns the gradient to send to the previous rank (None on the first)."""
        if mb not in self.saved:
            raise ValueError(f"rank {self.rank}: backward of microbatch {mb} before its forward (or twice)")
        if not self.is_last and grad is None:
            raise ValueError(f"rank {self.rank}: backward({mb}) needs the gradient from rank {self.rank + 1}")
        x, out = self.saved.pop(mb)
        out.backward(None if self.is_last else grad)
        self.done.add(mb)
        self.order.append(["B", mb])
        return None if self.is_first else x.grad


def _worker(student, m: int, seed: int):
    import torch.distributed as dist

    from labkit.groups import world_group

    from . import instrument
    instrument.install()
    fn = student.load()["loop"]
    group = world_group()
    stage = Stage(dist.get_rank(), dist.get_world_size(), m, seed)
    before = instrument.snapshot()
    with student.banning(OWN, "the 1F1B loop is the exercise"):
        fn(stage, group, m)
    return {"grads": {n: (p.grad if p.grad is not None else None) for n, p in stage.part.named_parameters()},
            "peak": stage.peak, "done": sorted(stage.done), "order": stage.order,
            "counts": instrument.difference(instrument.snapshot(), before)}


def _produce(student, world_size=2, m=4, seed=0, timeout=40.0):
    results, failure = ranks(_worker, world_size, student, m, seed, timeout=timeout)
    return failure or results


def _judge(data, world_size=2, m=4, seed=0, timeout=40.0):
    p = world_size
    title = f"one_f_one_b_loop (p={p}, m={m})"
    if isinstance(data, dict) and data.get("failed") == "hung":
        return report(title, False, f"{data['detail']}: the ranks wait for each other", "two blocking sends facing "
                      "each other (rank r sends its activation to r+1 while r+1 sends a gradient to r) both wait "
                      "for a receive: pair each send with the receive that goes with it (comm.send_recv)")
    bad = failed(title, data, "run your loop on 2 ranks with labkit.launch(..., live_output=True) and read the "
                 "traceback")
    if bad is not None:
        return bad
    for r, out in enumerate(data):
        if out["done"] != list(range(m)):
            return report(title, False, f"rank {r} ran the backward of microbatches {out['done']}, not all "
                          f"{m}", "every microbatch once forward and once backward on every rank")
    model = _model(p, seed)
    for tokens, labels in _batches(m, seed):
        (model.loss(tokens, labels) / m).backward()
    dense = dict(model.named_parameters())
    for r, out in enumerate(data):
        for name, g in out["grads"].items():
            problem = describe_mismatch(g if g is not None else 0 * dense[name].grad, dense[name].grad, 1e-12,
                                        1e-12, what=f"rank {r}, {name} grad: ")
            if problem:
                return report(title, False, problem, "each microbatch's activation must reach the next rank, "
                              "and its gradient the previous one, in the order they were made")
    for r, out in enumerate(data):
        if out["peak"] > min(p - r, m):
            return report(title, False, f"rank {r} held {out['peak']} microbatches at once (its order: "
                          f"{' '.join(k + str(mb) for k, mb in out['order'][:12])}...); 1F1B holds at most "
                          f"min(p - rank, m) = {min(p - r, m)}: this is GPipe's memory",
                          "start each rank's backwards after a warm-up of p - rank - 1 forwards")
    act = MBS * S * H * 8
    for r, out in enumerate(data):
        c = out["counts"]
        want = (m * act if r < p - 1 else 0) + (m * act if r > 0 else 0)
        got = c.get("send", {}).get("by_dtype", {}).get("float64", 0.0)
        if set(c) - {"send", "recv"} or far(got, want, 0.5):
            ops = ", ".join(f"{op} {v['bytes']:.0f}" for op, v in sorted(c.items())) or "nothing"
            return report(title, False, f"right gradients, but rank {r} sent {ops} bytes; one [b, s, h] "
                          f"activation forward and one gradient backward per microbatch is {want:.0f} of data, "
                          "point-to-point only", "send each activation once to rank + 1, each gradient once to "
                          "rank - 1")
    return report(title, True, f"every gradient equals the dense model's (float64, 1e-12); rank r held at most "
                  f"min(p - r, m) microbatches; one activation and one gradient per microbatch and boundary")


LOOP = Spec("one-f-one-b-loop", {"loop": "my_pipeline_step"}, _produce, _judge,
            cases=({"world_size": 2, "m": 4}, {"world_size": 4, "m": 6}), forbid=OWN, ranks=True,
            why="the 1F1B loop is the exercise", hints=(
                "three phases, as in exercise 1: warm-up forwards (receive from r - 1, send to r + 1), the steady "
                "state (one forward, one backward), the cool-down backwards (receive from r + 1, send to r - 1)",
                "in the steady state a rank sends its activation to r + 1 while r + 1 sends it a gradient: two "
                "blocking sends facing each other wait forever; post each send together with its receive",
                "steady state: g = comm.send_recv(group, y, r + 1, r + 1) after the forward (unless last), and "
                "x = comm.send_recv(group, dx, r - 1, r - 1) after the backward (unless first; a plain send for "
                "the last one); the first steady-state input is a plain comm.recv"))
SPECS = {LOOP.id: LOOP}
hint = asker(SPECS)


def one_f_one_b_loop(student_fn, world_size: int = 2, m: int = 4, seed: int = 0, timeout: float = 40.0):
    """Run the student's 1F1B loop on ``world_size`` ranks; print one [check] line."""
    return run(LOOP, {"loop": student_fn}, world_size=world_size, m=m, seed=seed, timeout=timeout)
