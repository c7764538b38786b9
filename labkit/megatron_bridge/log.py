"""Megatron-LM's training log read into pandas (chapter "From labkit to Megatron-LM").

The formats of Megatron-LM today (``training_log`` in megatron/training/training.py @ d98e8a64:
"[date time.microseconds]" prefix, TFLOP/s per GPU), Megatron-LM of 2021 (megatron/training.py @
81ad628e: no time stamp), Megatron-DeepSpeed (megatron/training.py @ 00caa0e9: samples per second,
TFLOPs) and ``labkit.train``'s: iteration lines, memory reports, the validation/test loss lines
(``evaluate_and_print_results``), the timer blocks (``megatron/core/timers.py``: min/max, max or all
ranks) and the "Theoretical memory footprints" line (``theoretical_memory_usage.py``, the numbers
``labkit estimate`` reproduces). A line that looks like one of these but does not read is a
ValueError naming its line number and text.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

# "key: value" fields of an iteration line -> (column, type); any other key is kept too
_FIELDS = {
    "consumed samples": ("consumed_samples", int),
    "consumed tokens": ("consumed_tokens", int),                      # Megatron-DeepSpeed
    "skipped samples": ("skipped_samples", int),
    "elapsed time per iteration (ms)": ("elapsed_ms", float),
    "throughput per GPU (TFLOP/s/GPU)": ("tflops_per_gpu", float),    # --log-throughput
    "energy per GPU (J/iter/GPU)": ("energy_j_per_gpu", float),
    "power per GPU (W/GPU)": ("power_w_per_gpu", float),
    "learning rate": ("learning_rate", float),
    "global batch size": ("global_batch_size", int),
    "lm loss": ("lm_loss", float),
    "loss scale": ("loss_scale", float),
    "grad norm": ("grad_norm", float),
    "num zeros": ("num_zeros", float),
    "params norm": ("params_norm", float),
    "actual seqlen": ("actual_seqlen", int),                          # Megatron-DeepSpeed
    "number of skipped iterations": ("skipped_iterations", int),
    "number of nan iterations": ("nan_iterations", int),
    "samples per second": ("samples_per_second", float),              # Megatron-DeepSpeed
    "tokens per gpu per second (tgs)": ("tokens_per_gpu_per_second", float),
    "TFLOPs": ("tflops_per_gpu", float),  # Megatron-DeepSpeed, per GPU (Narayanan et al. Eq. 3)
}
_MEMORY = {"allocated": "allocated_mb", "max allocated": "max_allocated_mb",
           "reserved": "reserved_mb", "max reserved": "max_reserved_mb",
           "total device memory used": "device_memory_used_mb"}
_ITER = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\]")
_MEM = re.compile(r"\[Rank (\d+)\]\s*(.*?)\s*memory \(MB\)\s*\|(.*)$")
_AFTER = re.compile(r"\(after (\d+) iterations\)")
_VALID = re.compile(r"validation(\S*) loss at (.*?)\s*\|(.*)$")
_TIMERS = re.compile(r"(\(min, max\) time|max time|times) across ranks \(ms\):\s*$")
_TIMER = re.compile(r"^\s+(\S.*?) \.*: (?:\(([-\d.]+), ([-\d.]+)\)|([-\d.]+))\s*$")
_TIMER_NAME, _TIMER_RANK = re.compile(r"^  (\S.*):\s*$"), re.compile(r"^\s+rank\s+(\d+): ([-\d.]+)\s*$")
_THEORY = re.compile(r"Theoretical memory footprints: (.*)$")


def _column(key: str) -> str:
    """An unknown field's column name: lower case, words joined by '_' ('mtp_1 loss' -> 'mtp_1_loss')."""
    return re.sub(r"[^0-9a-z]+", "_", key.lower()).strip("_")


def _value(text: str):
    """A field's value: int, float, or the text itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _fields(parts, known: dict) -> dict:
    row = {}
    for part in parts:
        key, sep, value = part.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            continue
        if key in known:
            name, kind = known[key]
            try:
                row[name] = kind(value)
            except ValueError:
                raise ValueError(f"field {key!r}: {value[:40]!r} is not {'an' if kind is int else 'a'} "
                                 f"{kind.__name__}") from None
        else:
            row[_column(key)] = _value(value)
    return row


def parse_line(line: str) -> dict | None:
    """One iteration line as a dict (every field: known ones typed and named, others kept under a
    snake_case name), or None if the line is not one."""
    m = _ITER.search(line)
    if m is None:
        return None
    row = {"iteration": int(m.group(1)), "train_iters": int(m.group(2))}
    stamp = _STAMP.search(line[:m.start()])
    if stamp:
        row["time"] = stamp.group(1)
    return row | _fields(m.group(3).split("|"), _FIELDS)


def parse_memory_line(line: str) -> dict | None:
    """``[Rank r] (after N iterations) memory (MB) | allocated: ... | max reserved: ...`` as a dict."""
    m = _MEM.search(line)
    if m is None:
        return None
    after = _AFTER.search(m.group(2))
    row = {"rank": int(m.group(1)), "iteration": int(after.group(1)) if after else None,
           "report": m.group(2)}
    known = {k: (v, float) for k, v in _MEMORY.items()}
    return row | _fields(m.group(3).split("|"), known)


def parse_memory(text: str):
    """Every memory report of a log (one row per rank and report), as a pandas DataFrame."""
    import pandas as pd
    rows = [r for _, r in _rows(text, parse_memory_line)]
    return pd.DataFrame(rows, columns=None if rows else ["rank", "iteration", "report"])


def parse_validation_line(line: str) -> dict | None:
    """`` validation loss at iteration 100 on validation set | lm loss value: 5.1E+00 | lm loss PPL:
    1.6E+02 |`` as {"iteration", "split" (validation | test), "name" (Megatron's -suffix),
    "lm_loss", "lm_loss_ppl", ...}; None if the line is not one."""
    m = _VALID.search(line)
    if m is None:
        return None
    at = re.search(r"iteration (\d+)", m.group(2))
    row = {"iteration": int(at.group(1)) if at else None,
           "split": "test" if "test set" in m.group(2) else "validation", "name": m.group(1).lstrip("-")}
    for part in m.group(3).split("|"):
        key, sep, value = (x.strip() for x in part.partition(":"))
        if sep and key:
            col = _column(key[:-6]) if key.endswith(" value") else _column(key)
            try:
                row[col] = float(value)
            except ValueError:
                raise ValueError(f"field {key!r}: {value[:40]!r} is not a float") from None
    return row


def parse_theoretical_memory(line: str) -> dict | None:
    """``Theoretical memory footprints: weight and optimizer=X MB, activation=Y MB, total=Z MB`` as
    {"weight_and_optimizer_mb", "activation_mb", "total_mb"} (older logs: the first only)."""
    m = _THEORY.search(line)
    if m is None:
        return None
    parts = re.findall(r"([a-z][a-z ]*?)=([-\d.]+) MB", m.group(1))
    if not parts:
        raise ValueError(f"no 'name=value MB' in {m.group(1)[:60]!r}")
    return {_column(k) + "_mb": float(v) for k, v in parts}


def parse_timers(text: str):
    """Megatron's timer blocks (``timers.log``, printed after an iteration line) as a DataFrame: one
    row per timer and block, {"iteration" (the last iteration line before it), "timer", "min_ms",
    "max_ms"} ("max" option: max_ms only; "all" option: one row per rank, "rank" and "ms")."""
    import pandas as pd
    rows, it, block, name = [], None, None, None
    for line in text.splitlines():
        row = parse_line(line) if "iteration" in line else None
        if row is not None:
            it, block = row["iteration"], None
            continue
        head = _TIMERS.search(line)
        if head:
            block, name = head.group(1), None
            continue
        if block is None:
            continue
        if block == "times":                       # "all": a name line, then one line per rank
            m, r = _TIMER_NAME.match(line), _TIMER_RANK.match(line)
            if m:
                name = m.group(1)
            elif r and name is not None:
                rows.append({"iteration": it, "timer": name, "rank": int(r.group(1)), "ms": float(r.group(2))})
            else:
                block = None
            continue
        m = _TIMER.match(line)
        if m is None:
            block = None
        elif m.group(4) is not None:
            rows.append({"iteration": it, "timer": m.group(1), "max_ms": float(m.group(4))})
        else:
            rows.append({"iteration": it, "timer": m.group(1), "min_ms": float(m.group(2)),
                         "max_ms": float(m.group(3))})
    return pd.DataFrame(rows, columns=None if rows else ["iteration", "timer", "min_ms", "max_ms"])


def _rows(text: str, parse) -> list:
    """(line number, row) of every line ``parse`` reads; a line it cannot read is a ValueError
    naming the line (number and text), never a bare conversion error."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            row = parse(line)
        except ValueError as err:
            raise ValueError(f"line {n}: {err}: {line.strip()[:160]!r}") from None
        if row is not None:
            out.append((n, row))
    return out


@dataclasses.dataclass
class MegatronLog:
    """Everything :func:`parse_log` reads (``full=True``): pandas DataFrames, and the theoretical
    footprint as a dict (None if the log has no such line)."""
    iterations: Any
    memory: Any
    validation: Any
    timers: Any
    theoretical_memory: dict | None


def parse_log(text: str, memory: bool = False, full: bool = False):
    """Every iteration line of a Megatron (or labkit) log, as a pandas DataFrame in file order;
    with ``memory=True`` also the memory reports: ``(iterations, memory)``; with ``full=True`` a
    :class:`MegatronLog` (validation/test losses, timer blocks, theoretical footprint too)."""
    import pandas as pd
    rows = [r for _, r in _rows(text, parse_line)]
    if not rows:
        raise ValueError("no Megatron iteration lines ('iteration N/ M | ...') in this text")
    df = pd.DataFrame(rows)
    if full:
        valid = [r for _, r in _rows(text, parse_validation_line)]
        theory = [r for _, r in _rows(text, parse_theoretical_memory)]
        return MegatronLog(df, parse_memory(text), pd.DataFrame(valid, columns=None if valid else
                                                                 ["iteration", "split", "name"]),
                           parse_timers(text), theory[0] if theory else None)
    return (df, parse_memory(text)) if memory else df
