"""Which virtual pipeline stage each pipeline rank holds as each of its model chunks: the one owner.

Chapters "Pipeline parallelism" and "Interleaved pipeline". With p pipeline ranks and v model
chunks per rank there are S = p*v virtual stages, each a contiguous block of L/S layers. Where
they sit is a placement (torchtitan's "loop" and "v" stage styles):

    "loop"   rank r holds stages r, r+p, ..., r+(v-1)p          Megatron-LM's interleaved placement
    "v"      v = 2: rank r holds stages r and 2p-1-r           V-shaped (ZB-V, Qi et al. 2024): the
                                                              last stage sits next to the first

It also answers for the consequences of a placement, which nobody re-derives:

    hands_off_locally / local_handoffs   stage s and s+1 on one rank: the activation (and, back, its
                                         gradient) passes as a tensor, no message (the V's turn)
    end_ranks / embedding_ranks          the ranks holding the first stage (the embedding) and the
                                         last (output layer, loss): Megatron's embedding group; one
                                         rank under the V, where a tied output layer reads the
                                         embedding itself (no copy, no all-reduce)
    rank_layers / holds_ends             what a rank holds: its layers, whether it holds an end

Every part of labkit that needs an answer asks this module: the split of the model and the tie
(``stage.split``), the embedding group (``Topology.embedding_groups``), the schedules' dependencies
(``schedules.dependencies``), the p2p plan, the executor, the calculators' per-rank parameters and
memory (``labkit.calc.params``, so ``labkit.preflight``) and ``TrainConfig``. A schedule
(``SCHEDULES``) names its builder and its placement, so ``TrainConfig.pipeline_schedule`` picks
both. Pure Python, no imports: it is shipped to the browser with ``labkit.calc``.
"""
from __future__ import annotations

PLACEMENTS = ("loop", "v")

# TrainConfig.pipeline_schedule -> (builder name in schedules.py, placement, chunks per rank or None)
SCHEDULES = {
    "1f1b": ("one_f_one_b", "loop", 1),
    "interleaved_1f1b": ("interleaved", "loop", None),    # v from num_layers_per_virtual_pipeline_stage
    "gpipe": ("gpipe", "loop", 1),
    "zb_h1": ("zb_h1", "loop", 1),
    # GPipe's order (Huang et al. 2019, arXiv:1811.06965) on the V placement of Qi et al. 2024
    # ("Pipeline Parallelism with Controllable Memory", arXiv:2405.15362; torch's style="v")
    "gpipe_v": ("gpipe_v", "v", 2),
}


def placement_of(schedule: str) -> str:
    """The placement schedule ``schedule`` (a name of ``SCHEDULES``) runs on."""
    check_schedule(schedule)
    return SCHEDULES[schedule][1]


def default_schedule(v: int) -> str:
    """Megatron's choice: 1F1B, or its interleaved 1F1B when each rank holds v > 1 chunks."""
    return "interleaved_1f1b" if v > 1 else "1f1b"


def check_schedule(name: str, v: int | None = None) -> None:
    """ValueError unless ``name`` is a schedule labkit runs (with v chunks per rank, if given)."""
    if name not in SCHEDULES:
        raise ValueError(f"pipeline_schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
    chunks = SCHEDULES[name][2]
    if v is not None and chunks is not None and chunks != v:
        raise ValueError(f"pipeline_schedule {name!r} runs {chunks} model chunk{'s' if chunks > 1 else ''} per rank, but "
                         f"num_layers_per_virtual_pipeline_stage gives v = {v}")


def _check(p: int, v: int, placement: str) -> None:
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    if placement == "v" and v != 2:
        raise ValueError(f"the V-shaped placement holds 2 chunks per rank, got v = {v}")


def stage_of(rank: int, chunk: int, p: int, v: int = 1, placement: str = "loop") -> int:
    """The virtual stage pipeline rank ``rank`` holds as its model chunk ``chunk``."""
    _check(p, v, placement)
    if placement == "v" and chunk == 1:
        return 2 * p - 1 - rank
    return chunk * p + rank


def holder(stage: int, p: int, v: int = 1, placement: str = "loop") -> tuple[int, int]:
    """(rank, chunk) holding virtual stage ``stage``: the inverse of :func:`stage_of`."""
    _check(p, v, placement)
    chunk, rank = divmod(stage, p)
    if placement == "v" and chunk == 1:
        rank = p - 1 - rank
    return rank, chunk


def rank_stages(rank: int, p: int, v: int = 1, placement: str = "loop") -> list[int]:
    """The virtual stages of ``rank``, chunk 0 first."""
    return [stage_of(rank, c, p, v, placement) for c in range(v)]


def stage_layers(num_layers: int, num_stages: int, stage: int) -> range:
    """Layers of virtual stage ``stage`` of ``num_stages``: an even, contiguous split."""
    n = num_layers // num_stages
    return range(stage * n, (stage + 1) * n)


def rank_layers(num_layers: int, rank: int, p: int, v: int = 1, placement: str = "loop") -> list[int]:
    """Every layer pipeline rank ``rank`` holds, chunk by chunk."""
    return [i for s in rank_stages(rank, p, v, placement) for i in stage_layers(num_layers, p * v, s)]


# -- consequences --------------------------------------------------------------------------------
def hands_off_locally(stage: int, p: int, v: int = 1, placement: str = "loop") -> bool:
    """True when stage ``stage`` and stage + 1 sit on one rank: its output, and back the gradient
    of it, pass as a tensor between two chunks of that rank, never as a message to itself."""
    return stage + 1 < p * v and holder(stage, p, v, placement)[0] == holder(stage + 1, p, v, placement)[0]


def local_handoffs(p: int, v: int = 1, placement: str = "loop") -> list[int]:
    """Stages s handing off to s + 1 on their own rank: none in the loop (p > 1), [p - 1] in the V."""
    return [s for s in range(p * v - 1) if hands_off_locally(s, p, v, placement)]


def end_ranks(p: int, v: int = 1, placement: str = "loop") -> tuple[int, int]:
    """(rank holding the first stage: the embedding, rank holding the last: final norm, output layer,
    loss). Loop: (0, p - 1); V: (0, 0)."""
    return holder(0, p, v, placement)[0], holder(p * v - 1, p, v, placement)[0]


def embedding_ranks(p: int, v: int = 1, placement: str = "loop") -> list[int]:
    """Megatron's embedding group as pipeline ranks: the ranks holding an end. Two ranks keep a
    tied word embedding in two copies whose gradients they sum; one rank (the V) holds it once."""
    return sorted(set(end_ranks(p, v, placement)))


def holds_ends(rank: int, p: int, v: int = 1, placement: str = "loop") -> tuple[bool, bool]:
    """(holds the first stage, holds the last stage) for pipeline rank ``rank``."""
    first, last = end_ranks(p, v, placement)
    return rank == first, rank == last
