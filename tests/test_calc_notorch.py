"""labkit.calc imports and runs with torch, numpy and pandas unimportable (as in Pyodide)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'torch', 'numpy', 'pandas', 'matplotlib', 'ipywidgets'}:
            raise ImportError('blocked for the no-torch test: ' + name)
sys.meta_path.insert(0, Block())
import labkit.calc as c
m = c.model('gpt3-175b')
par = c.ParallelConfig(world_size=1024, tensor_model_parallel_size=8, pipeline_model_parallel_size=16,
                       global_batch_size=1536, sequence_parallel=True, recompute_granularity='selective',
                       use_distributed_optimizer=True)
e = c.megatron_estimate(1024, **c.flops.megatron_kwargs(m, par))
rows = c.memory_per_stage(m, par)
r = c.step_time(m, par, c.cluster('dgx-a100', 128))
from labkit.calc import cli
assert cli.main(['--world-size', '8', '--num-layers', '2', '--hidden-size', '64',
                 '--num-attention-heads', '4', '--vocab-size', '256', '--seq-length', '64',
                 '--micro-batch-size', '1']) == 0
from labkit.calc import report
assert 'data-key="peak_gib"' in report.calculate('memory', {})
assert 'torch' not in sys.modules and 'numpy' not in sys.modules
print('OK', e['weight_and_optimizer_bytes'], len(rows))
"""


def test_calc_runs_without_torch_numpy_pandas():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "OK 10784206080.0 16" in out.stdout   # Megatron d98e8a64: norms replicated over TP


def test_the_browser_bundle_holds_every_module_it_imports(tmp_path):
    """The files the book ships to Pyodide (book/_ext/labkit_static.py ``sources``) import with
    nothing else on the path: a module labkit.calc or the topology starts to import is shipped too."""
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        import labkit_static
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    for src in labkit_static.sources():
        rel = src.name if src.parent == labkit_static.HERE else src.relative_to(ROOT).as_posix()
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(src.read_text())
    script = (f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n" + SCRIPT.split("import labkit.calc")[0]
              + "import labkit, labkit_answers\nassert labkit.__file__.startswith(sys.path[0]), labkit.__file__\n"
                "a = labkit_answers.calculate('memory', {})\nassert 'error' not in a, a\n"
                "a = labkit_answers.calculate('memory-explorer', {})\nassert 'error' not in a, a\nprint('OK')\n")
    out = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr
