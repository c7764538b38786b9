"""The tutorial's experiments as a catalogue (chapter "From labkit to Megatron-LM").

    python -m labkit experiments list                                  # every experiment, by its ID
    python -m labkit experiments run train-tp2-gpt2-large-2gpu --scale cpu   # gloo ranks, small model
    torchrun --nproc-per-node 2 -m labkit experiments run 302         # full size, one GPU per rank
    python -m labkit experiments run 302 --megatron                    # the pretrain_gpt.py command
    python -m labkit experiments report                                # runs vs measured vs labkit.calc
    make 302<TAB>                                                      # the same, from the Makefile

    catalogue.py   Experiment, CATALOGUE (from data/*.csv), get(id or unique prefix)
    runner.py      run(id, scale): labkit.train -> outdir/<ID>/logs.txt; megatron_command
    report.py      report(outdir): one table: runs, the tutorial's measurements, calculators
    cli.py         the ``experiments`` subcommand
"""
from .catalogue import CATALOGUE, Experiment, get

__all__ = ["CATALOGUE", "Experiment", "get", "run", "megatron_command", "report"]


def __getattr__(name):  # torch and pandas only when a run or a report is asked for
    if name in ("run", "megatron_command"):
        from . import runner
        return getattr(runner, name)
    if name == "report":
        from .report import report
        return report
    raise AttributeError(f"module 'labkit.experiments' has no attribute {name!r}")
