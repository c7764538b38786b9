"""labkit's checks of a training run's numbers and types, before any process starts.

Megatron-LM's argparse gives every flag its type, and a few rules catch the rest; a Python caller
of ``labkit.train`` has no argparse in the way, so ``sequence_parallel='no'`` (truthy: SP on),
``lr=inf`` (trains silently to a nan loss) or ``log_interval=1.5`` would get through, or fail inside
a rank. :func:`check_hyperparameters` runs first in ``labkit.config.check`` (every TrainConfig
validation) and :func:`check_run_arguments` in ``labkit.preflight`` (the arguments of ``train``
that are not configuration). Each refusal is a ValueError naming the argument, the rule and the
value. Pure Python (no torch).
"""
from __future__ import annotations

import dataclasses
import math
import numbers

SEED_LIMIT = 2 ** 32   # numpy.random.RandomState (the indexed-dataset sampler) takes 0 <= seed < 2**32


def _finite(name, value, low, low_open=False, high=None, high_open=True) -> None:
    """A real number in the range given (nan and inf are never in it)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < low or (low_open and value == low) or (high is not None and (
            value > high or (high_open and value == high))):
        rng = (f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}" if high is not None
               else f"{'>' if low_open else '>='} {low}")
        raise ValueError(f"{name} must be {'in ' if high is not None else ''}{rng}, got {value!r}")


def _check_types(cfg) -> None:
    """Every field of a configuration dataclass holds what its annotation says: a bool is a bool
    (not 'no', not 1), an int an int (not 2.0, not True), a float a real number, a str a str."""
    for f in dataclasses.fields(cfg):
        value, kinds = getattr(cfg, f.name), [k.strip() for k in str(f.type).split("|")]
        if value is None and "None" in kinds:
            continue
        ok = {"bool": lambda v: isinstance(v, bool),
              "int": lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
              "float": lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool),
              "str": lambda v: isinstance(v, str),
              "tuple": lambda v: isinstance(v, (tuple, list))}
        known = [k for k in kinds if k in ok]
        if len(known) == len([k for k in kinds if k != "None"]) and not any(ok[k](value) for k in known):
            words = {"bool": "True or False", "int": "an integer", "float": "a number", "str": "a string",
                     "tuple": "a list", "None": "None"}
            raise ValueError(f"{f.name} must be {' or '.join(words.get(k, k) for k in kinds)}, got "
                             f"{value!r} ({type(value).__name__})")


def check_hyperparameters(cfg) -> None:
    """Types of every field, then the optimizer's numbers: lr finite > 0, weight_decay finite
    >= 0, adam_beta1/2 in [0, 1), adam_eps finite > 0, clip_grad finite >= 0 (0: no clipping),
    dropouts finite in [0, 1)."""
    _check_types(cfg)
    _finite("lr", cfg.lr, 0, low_open=True)
    _finite("weight_decay", cfg.weight_decay, 0)
    _finite("adam_beta1", cfg.adam_beta1, 0, high=1)
    _finite("adam_beta2", cfg.adam_beta2, 0, high=1)
    _finite("adam_eps", cfg.adam_eps, 0, low_open=True)
    _finite("clip_grad", cfg.clip_grad, 0)
    _finite("hidden_dropout", cfg.hidden_dropout, 0, high=1)
    _finite("attention_dropout", cfg.attention_dropout, 0, high=1)


def check_run_arguments(seed=0, log_interval=1, timeout=None) -> None:
    """``labkit.train``'s own arguments: seed an int in [0, 2**32), log_interval an int >= 0 (0:
    no iteration lines), timeout finite > 0 seconds."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    if isinstance(log_interval, bool) or not isinstance(log_interval, numbers.Integral) or log_interval < 0:
        raise ValueError(f"log_interval must be an integer >= 0 (0: no iteration lines), got {log_interval!r}")
    if timeout is not None:
        _finite("timeout", timeout, 0, low_open=True)
