"""labkit: Megatron-style parallelism, small enough to read, proven equal to one device.

Public API (the book, the labs and external checks use these names):

    labkit.Topology(world_size, tp=1, pp=1, cp=1, ep=1, etp=None)   rank layout, pure (labkit/topology.py)
    labkit.launch(fn, world_size, *args, **kwargs)         run fn on N ranks    (labkit/launcher.py)
    labkit.train(world_size=1, steps=..., **config)        one training loop    (labkit/training.py)
    labkit.comm, labkit.model, labkit.calc, labkit.check   modules

The package is layered (README, "Design"; tests/test_layers.py enforces it): pure rules and
calculators (config, topology, param_attrs, calc/, pipeline schedules) below the runtime (launcher,
groups, comm, model, data), below one folder per parallelism (tensor_parallel/, pipeline_parallel/,
data_parallel/, ...), below composition (parallelize, training, reference), below tools (measure/,
check/, notebooks, widgets, megatron_bridge, __main__).

Modules that are also functions live in files of another name (``launch`` in launcher.py,
``train`` in training.py): a submodule import would otherwise replace the function on the
package. Everything but ``Topology`` (pure) is imported lazily, ``calc`` included, so
``import labkit.calc`` works on a machine without torch (the static book runs it in the browser).
"""
from .topology import Topology

__all__ = ["Topology", "launch", "train"]
__version__ = "0.1.0"

_LAZY = {"launch": ("launcher", "launch"), "train": ("training", "train")}


def __getattr__(name):  # PEP 562: import torch-dependent parts on first use
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{module}", __name__), attr)
    if name in {"comm", "groups", "model", "data", "check", "calc", "config", "launcher", "training",
                "parallelize", "reference", "notebooks", "measure", "param_attrs",
                "tensor_parallel", "pipeline_parallel", "data_parallel", "context_parallel",
                "expert_parallel", "megatron_bridge"}:
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")
