"""Chapter instruments: what the book and the labs measure, one module per chapter.

    dp.py, dp_plot.py      data parallelism: parity, bytes, memory, overlap timelines (dp_plot: the
                           two timelines share one x-range covering both)
    pipeline.py            pipeline schedules run for real: timelines, bubbles, memory
    activations.py         what autograd saves, measured and itemized (TP, SP, PP chapters)
    tensor_parallel.py     one transformer layer, dense vs cut: outputs, gradients, bytes
    context_parallel.py, cp_table.py   context parallelism: parity, bytes, activations,
                           balance, the gpt2-xl table
    expert_parallel.py     expert parallelism: parity, bytes, memory, load balance and drops
    ptdp.py                the composed chapter: a composed run, per-strategy memory

The book's figures are drawn from these by ``labkit.figures`` (one module per chapter).
"""
from __future__ import annotations


def roundoff(diff: float, tol: float) -> str:
    """A difference as the notebooks print it: ``"<= 1e-12"`` when within ``tol``, else the value.

    Round-off differs from CPU to CPU (vector width, BLAS kernels), so stored outputs show the
    bound a run must meet, not its last digits; a run that misses it prints the number instead
    and no longer matches the stored output.
    """
    return f"<= {tol:.0e}" if abs(diff) <= tol else f"{abs(diff):.1e} (> {tol:.0e})"
