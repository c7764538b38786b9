"""Run a graded notebook cell by cell in a kernel that survives timeouts and crashes.

Each cell gets ``timeout`` seconds. When a cell runs over, or the kernel dies in it (``os._exit``,
a segfault, out of memory), the kernel is replaced by a fresh one into which the cells that had
finished are replayed (check cells excepted: they only print), so the later exercises are still
graded. (Interrupting a cell that ran over would keep the kernel, but nbclient leaves the cell's
output reader running after a timeout, and it would swallow the next cells' output.) After
``max_restarts`` replacements the rest is not run.
"""
from __future__ import annotations

import copy
import math
import subprocess
from dataclasses import dataclass


@dataclass
class Outcome:
    state: str          # "ok" | "error" (it raised) | "timeout" | "dead" (the kernel died in it)
    error: str = ""     # "NameError: name 'x' is not defined" for "error"


class Kernel:
    def __init__(self, nb, cwd: str, timeout: float):
        from nbclient import NotebookClient
        self.client = NotebookClient(nb, timeout=math.ceil(timeout),   # nbclient takes whole seconds
                                     kernel_name="python3", allow_errors=True, record_timing=False,
                                     interrupt_on_timeout=False, resources={"metadata": {"path": cwd}})
        self.client.km = self.client.create_kernel_manager()
        self.client.start_new_kernel(stderr=subprocess.DEVNULL)   # the kernel's own warnings
        self.client.start_new_kernel_client()

    def run(self, cell, index: int) -> Outcome:
        from nbclient.exceptions import CellTimeoutError, DeadKernelError
        try:
            self.client.execute_cell(cell, index)
        except CellTimeoutError:
            return Outcome("timeout")
        except DeadKernelError:
            return Outcome("dead")
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            return Outcome("error", f"{errors[-1].get('ename')}: {errors[-1].get('evalue')}")
        return Outcome("ok")

    def close(self):
        try:
            self.client._cleanup_kernel()
        except Exception:  # noqa: BLE001 - it may be dead already
            pass


def run_cells(nb, cells, cwd: str, timeout: float, is_check, max_restarts: int = 3):
    """Execute ``cells`` (nbformat nodes, outputs written in place) in order.

    Returns (outcomes, aborted): outcomes[i] is None for a cell never run; aborted is "" or why
    the remaining cells were not run.
    """
    outcomes: list[Outcome | None] = [None] * len(cells)
    kernel, restarts, aborted = Kernel(nb, cwd, timeout), 0, ""
    try:
        for i, cell in enumerate(cells):
            if cell.get("cell_type") != "code":
                continue
            outcomes[i] = out = kernel.run(cell, i)
            if out.state in ("ok", "error"):
                continue
            kernel.close()
            restarts += 1
            if restarts > max_restarts:
                aborted = f"the kernel had to be restarted more than {max_restarts} times"
                break
            kernel = Kernel(nb, cwd, timeout)
            done = [k for k in range(i) if outcomes[k] and outcomes[k].state in ("ok", "error")
                    and not is_check(cells[k])]
            if any(kernel.run(copy.deepcopy(cells[k]), k).state not in ("ok", "error") for k in done):
                aborted = "after a restart, the earlier cells could not be replayed in a fresh kernel"
                break
    finally:
        kernel.close()
    return outcomes, aborted
