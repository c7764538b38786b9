"""Noise or bug? Within the measured envelope, or outside it and from which step (pure Python).

Two runs of one precision (a parallel run and the one-device run, or two layouts) are compared
step by step on what every Megatron log prints, the loss and the gradient norm:
d_k = |a_k - b_k| / |b_k|. The threshold at step k is ``MARGIN`` times the envelope's band there
(the largest drift of any clean pair measured up to step k; beyond the measured steps the band is
extended linearly), and never below what the inputs can resolve: a Megatron log prints the loss
with 7 significant digits and the grad norm with 3 decimals, so two printed values of equal
numbers differ by up to one rounding each. The pair is outside at the first step where either
channel exceeds its threshold (a NaN or inf on one side only is outside at once).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

MARGIN = 4.0            # the threshold is 4x the largest clean drift measured (calibrated; bench_drift)
U32 = 2.0 ** -24        # a loss or norm held in fp32: one rounding either side
CHANNELS = ("loss", "grad_norm")


@dataclass
class Series:
    """A run's logged values: per iteration the loss and the grad norm (None where not logged),
    and each value's absolute print resolution (half a unit of the last printed digit; 0 for JSON)."""
    iterations: list
    loss: list
    grad_norm: list
    resolution: dict = field(default_factory=lambda: {"loss": None, "grad_norm": None})

    def res(self, channel: str, i: int) -> float:
        r = self.resolution.get(channel)
        return 0.0 if r is None else r[i]


@dataclass
class Verdict:
    within: bool
    family: str
    precision: str
    left_at: int | None          # the first iteration outside (None: within)
    channel: str | None          # "loss" or "grad_norm" there
    drift: float | None          # d_k there (outside), or at the pair's closest approach (within)
    threshold: float | None
    worst: float                 # max over steps and channels of d_k / threshold_k
    fraction: float | None       # share of the envelope's clean pairs whose worst is at least this one's
    clean_pairs: int

    def text(self) -> str:
        where = f"the envelope of {self.family} {self.precision}"
        if not self.within:
            return (f"outside {where}: left at iteration {self.left_at} ({self.channel.replace('_', ' ')} "
                    f"differs by {self.drift:.2e}, threshold {self.threshold:.2e}) - look for a bug")
        share = ("" if self.fraction is None else
                 f"; {round(self.fraction * self.clean_pairs)} of {self.clean_pairs} clean pairs "
                 f"({self.fraction:.0%}) drift this far")
        return f"within {where}: at most {self.worst:.2f} of the threshold{share} - noise"


def _printed_resolution(value: float, digits: int) -> float:
    """Half a unit of the last digit of ``value`` printed as %.{digits}E."""
    if not math.isfinite(value) or value == 0:
        return 0.0
    return 0.5 * 10.0 ** (math.floor(math.log10(abs(value))) - digits)


def series_from_log(text: str) -> Series:
    """A Megatron (or labkit) training log: its iteration lines (``parse_log``)."""
    from ..megatron_bridge.log import parse_log
    df = parse_log(text)
    it, loss = [int(x) for x in df["iteration"]], [float(x) for x in df["lm_loss"]]
    gn = [None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)
          for x in (df["grad_norm"] if "grad_norm" in df else [None] * len(it))]
    return Series(it, loss, gn, {"loss": [_printed_resolution(x, 6) for x in loss],
                                 "grad_norm": [0.0005] * len(it)})


def series_from_json(obj) -> Series:
    """A labkit run: a list of losses, or {"losses": [...], "grad_norms": [...]} (a TrainResult's fields)."""
    if isinstance(obj, list):
        obj = {"losses": obj}
    loss = [float(x) for x in obj["losses"]]
    gn = obj.get("grad_norms") or [None] * len(loss)
    return Series(list(range(1, len(loss) + 1)), loss, [None if g is None else float(g) for g in gn])


def read_series(path: str) -> Series:
    """A file: JSON (labkit run) or a Megatron log (anything else)."""
    with open(path) as f:
        text = f.read()
    try:
        return series_from_json(json.loads(text))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return series_from_log(text)


def drift(a: float | None, b: float | None) -> float | None:
    """|a - b| / |b|; None if either is missing; inf where the two differ in finiteness or b = 0 ≠ a."""
    if a is None or b is None:
        return None
    if not (math.isfinite(a) and math.isfinite(b)):
        return 0.0 if (a == b) else math.inf          # NaN != NaN: a NaN on both sides is inf too
    if a == b:
        return 0.0
    return abs(a - b) / abs(b) if b != 0 else math.inf


def threshold(band: list, k: int, floor: float, margin: float = MARGIN) -> float:
    """MARGIN x the band at step k (1-based; extended linearly past its end), at least ``floor``."""
    if not band:
        return floor
    b = band[k - 1] if k <= len(band) else band[-1] * k / len(band)
    return max(margin * b, floor)


def _curves(a: Series, b: Series, cell: dict | None):
    """(step k, channel, d_k, threshold_k) for every common iteration and logged channel."""
    idx_b = {it: i for i, it in enumerate(b.iterations)}
    for i, it in enumerate(a.iterations):
        j = idx_b.get(it)
        if j is None:
            continue
        for ch in CHANNELS:
            av, bv = getattr(a, ch)[i], getattr(b, ch)[j]
            d = drift(av, bv)
            if d is None:
                continue
            floor = (a.res(ch, i) + b.res(ch, j)) / abs(bv) + 2 * U32 if bv not in (0, None) and math.isfinite(bv) else 0.0
            band = cell["band"][ch] if cell else []
            yield it, ch, d, threshold(band, it, floor)


def _worst(curves) -> float:
    return max((d / t if t > 0 else (math.inf if d > 0 else 0.0) for _, _, d, t in curves), default=0.0)


def _pair_worst(pair: dict, cell: dict) -> float:
    """The worst d_k / threshold_k of a stored clean pair (its drifts d_k, from JSON runs)."""
    return _worst([(k, ch, d, threshold(cell["band"][ch], k, 2 * U32))
                   for ch in CHANNELS for k, d in enumerate(pair[ch], 1)])


def decide(a: Series, b: Series, family: str, precision: str, envelopes: dict) -> Verdict:
    """Within or outside ``envelopes["cells"][family][precision]`` (a pair on one device: within
    only what the inputs resolve, as two one-device runs of one seed are bitwise equal)."""
    cell = None
    if family != "one device":
        cell = envelopes["cells"].get(family, {}).get(precision)
        if cell is None or "band" not in cell:
            have = sorted(f"{f} {p}" for f, c in envelopes["cells"].items() for p, v in c.items() if "band" in v)
            raise ValueError(f"no measured envelope for {family} {precision}; measured: {', '.join(have)}")
    curves = list(_curves(a, b, cell))
    if not curves:
        raise ValueError("the two runs share no logged iteration")
    pairs = cell["pairs"] if cell else []
    for it, ch, d, t in curves:
        if d > t:
            return Verdict(False, family, precision, it, ch, d, t, _worst(curves), 0.0 if pairs else None, len(pairs))
    worst = _worst(curves)
    it, ch, d, t = max(curves, key=lambda c: c[2] / c[3] if c[3] > 0 else 0.0)
    clean = [_pair_worst(p, cell) for p in pairs]
    fraction = sum(c >= worst for c in clean) / len(clean) if clean else None
    return Verdict(True, family, precision, None, ch, d, t, worst, fraction, len(pairs))


def load_envelopes(path: str = "data/envelopes.json") -> dict:
    with open(path) as f:
        return json.load(f)


def leave_one_out(envelopes: dict, precision: str = "bf16", margin: float = MARGIN) -> tuple[int, int]:
    """(flagged, judged): each stored clean pair of every family's ``precision`` cell judged against
    the band of the cell's other pairs at ``margin``: the false-alarm rate to expect on a new seed,
    from the envelopes' own runs (no held-out pair needed to choose the margin)."""
    from .measure import band
    flagged = judged = 0
    for by_prec in envelopes["cells"].values():
        pairs = by_prec.get(precision, {}).get("pairs", [])
        for i, pair in enumerate(pairs if len(pairs) > 1 else []):
            rest = band(pairs[:i] + pairs[i + 1:])
            worst = _worst([(k, ch, d, threshold(rest[ch], k, 2 * U32, margin))
                            for ch in CHANNELS for k, d in enumerate(pair[ch], 1)])
            flagged, judged = flagged + (worst > 1), judged + 1
    return flagged, judged
