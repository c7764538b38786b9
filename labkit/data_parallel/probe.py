"""What per-layer ZeRO-2/3 did, recorded only while a caller asks (chapter "Memory knobs").

Measurement attaches, never sits in the path: ``with dp.recording() as rec:`` (fsdp.py) gives a
:class:`UnitProbe` that the DP object fills inside the block; outside it (every plain run) the
hooks record nothing and measure nothing. ``labkit.measure.memory_knobs.fsdp_timeline`` draws it.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class UnitProbe:
    events: list = field(default_factory=list)   # (event, unit): "gather", "compute", "compute
    #                                              backward", "free", "reduce_scatter", in order
    samples: list = field(default_factory=list)  # (event, unit, live parameter bytes) at each event
    grad_samples: list = field(default_factory=list)  # bytes of full gradients held at each reduce-scatter

    def sample(self, what: str, unit: int, live_bytes: int) -> None:
        self.events.append((what, unit))
        self.samples.append((what, unit, live_bytes))
