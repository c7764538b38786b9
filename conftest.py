"""pytest at the repository root: what the notebooks collected by ``--nbval`` need (book/, labs/,
solutions/). The tests' own fixtures are in tests/conftest.py."""
import logging
import time


def _start_kernels_again_when_one_dies_starting() -> None:
    """nbval starts one kernel per notebook and fails all its cells when that kernel dies before it
    answers. A kernel can die there for a reason outside the notebook: jupyter_client picks its 5
    TCP ports, frees them and starts the kernel, which binds them seconds later, and meanwhile the
    gloo ranks of the other xdist worker connect from ephemeral ports (seen once in CI: all cells of
    one notebook "Kernel died before replying to kernel_info"). No cell has run then, so a second
    kernel is a new start, not a second try of a test; a third failure is reported as nbval does."""
    try:
        import nbval.kernel as nk
    except ImportError:                               # nbval not installed: no notebooks collected
        return
    start = nk.start_new_kernel
    if getattr(start, "starts_again", False):
        return

    def start_new_kernel(*args, **kwargs):
        for attempt in range(3):
            try:
                return start(*args, **kwargs)
            except RuntimeError as e:
                if attempt == 2 or "died" not in str(e):
                    raise
                logging.getLogger("nbval").warning("the kernel died while starting (%s); starting another", e)
                time.sleep(1.0)

    start_new_kernel.starts_again = True
    nk.start_new_kernel = start_new_kernel


_start_kernels_again_when_one_dies_starting()
