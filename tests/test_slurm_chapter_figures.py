"""The figures of the chapter "From labkit to Megatron-LM" (labkit.figures.megatron_bridge): vector,
deterministic, every label >= 9 CSS px on a phone and on a desktop, and drawn from what they are
given (the flags, the recorded Slurm job's processes, the experiments report)."""
import json
import re
from pathlib import Path

import pytest

from labkit.calc.megatron_args import FLAGS
from labkit.config import TrainConfig
from labkit.figures import MIN_LABEL_PX, smallest_label_px, svg
from labkit.figures import megatron_bridge as FB
from labkit.megatron_bridge import parse_log, to_flags

ROOT = Path(__file__).resolve().parent.parent
RECORD = json.loads((ROOT / "examples" / "slurm" / "train_cpu.record.json").read_text())


def drawn(name, tmp_path_factory):
    if name == "round_trip":
        cfg = TrainConfig(tensor_model_parallel_size=2, sequence_parallel=True, micro_batch_size=8,
                          global_batch_size=8)
        return FB.round_trip(to_flags(cfg, steps=4), parse_log(RECORD["ok"]["output"]), len(FLAGS))
    if name == "slurm_job":
        topo = TrainConfig(tensor_model_parallel_size=2, micro_batch_size=2, global_batch_size=8).validate(4)
        return FB.slurm_job(RECORD["ok"]["processes"], topo)
    from labkit.experiments.report import report
    return FB.memory_vs_measured(report(tmp_path_factory.mktemp("no-runs")))


@pytest.mark.parametrize("name", ["round_trip", "slurm_job", "memory_vs_measured"])
def test_vector_deterministic_legible(name, tmp_path_factory):
    text = svg(drawn(name, tmp_path_factory))
    assert text == svg(drawn(name, tmp_path_factory))             # the same inputs, the same bytes
    assert "<text" in text and "<image" not in text                # labels as text, no raster
    for column_px in (350, 1400):
        assert smallest_label_px(text, column_px) >= MIN_LABEL_PX, (name, column_px)


def test_slurm_job_draws_the_recorded_processes(tmp_path_factory):
    text = svg(drawn("slurm_job", tmp_path_factory))
    for label in ("node n1", "node n2", "rendezvous store", "GROUP_RANK 0", "GROUP_RANK 1",
                  "rank 0", "rank 1", "rank 2", "rank 3", "DP ranks 0, 2", "DP ranks 1, 3"):
        assert label in text, label


def test_memory_figure_marks_the_runs_that_ran_out_of_memory(tmp_path_factory):
    text = svg(drawn("memory_vs_measured", tmp_path_factory))
    assert len(re.findall(r">\s*OOM<", text)) == 2
    assert "H200-141GB" in text and "H100-80GB" in text
