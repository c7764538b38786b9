"""Tier 1: ``--moe-layer-freq`` parsed without eval (issue 24, "failing safely"): Megatron's whole
grammar (ints, lists, + and *), each list's length known before it is built, short errors."""
import subprocess
import sys

import pytest

from labkit.calc import moe
from labkit.calc.moe import parse_layer_freq


@pytest.mark.parametrize("text, layers, want", [
    ("2", None, 2),
    ("[0]*3+[1]*58", 61, [0] * 3 + [1] * 58),          # Megatron's examples (DeepSeek-V3, -R1)
    ("([0]+[1]*26)", 27, [0] + [1] * 26),               # DeepSeek-V2-Lite
    ("([0,1]*24)", 48, [0, 1] * 24),                    # Llama-4 Maverick
    ("[0]*1+[1]*60", 61, [0] + [1] * 60),               # Kimi-K2
    ("([1]*3+[0]*1)*3", 12, [1, 1, 1, 0] * 3),          # moe_freq_type's docstring
    ("2*[1,0]", 4, [1, 0, 1, 0]),
    ("[1]*(2*3)", 6, [1] * 6),
    ("[1,0,1,0]", 4, [1, 0, 1, 0]),                     # what to_flags writes
])
def test_megatrons_forms_are_accepted(text, layers, want):
    assert parse_layer_freq(text, layers) == want


@pytest.mark.parametrize("text, message", [
    ("[1, 0, 1, 0]", r"Invalid pattern: character ' ' at 3"),          # Megatron refuses spaces too
    ("[1]*2+__import__('os')", r"Invalid pattern: character '_'"),
    ("[[1]]*2", r"list entries must be integers"),
    ("[1]*9**9**9", r"only integers, lists, \+ and \* are allowed"),
    ("[1]*10**8", r"only integers, lists, \+ and \* are allowed"),
    ("[1]*100000000", r"makes a list of 100000000 entries, more than num_layers 4"),
    ("[1]*(99999*99999*99999)", r"the number 99999 .* is more than the 4 layers"),
    ("[1]*3*3", r"makes a list of 9 entries, more than num_layers 4"),
    ("[1]+2", r"cannot add a list and a number"),
    ("[1]*[1]", r"cannot multiply a list and a number, or two lists"),
    ("([1],0)", r"only integers, lists"),
    ("(1,0)", r"must be an integer or a list expression"),
    ("[1]*", r"not a list expression"),
    ("[" * 300 + "]" * 300, r"not a list expression|nested too deeply|list entries must be integers"),
    ("[1]+" * 2000 + "[1]", r"nested too deeply|makes a list of|not a list expression"),
    ("x", r"must be an integer or a list expression"),
    ("1" * 20, r"must be an integer or a list expression"),
])
def test_bad_patterns_are_short_value_errors(text, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_layer_freq(text, 4)
    assert len(str(err.value)) < 200                     # at most a short excerpt of the text


def test_a_list_too_long_is_refused_before_it_is_built(monkeypatch):
    built = []
    monkeypatch.setattr(moe, "_build", lambda node: built.append(node))
    for text in ("[1]*100000000", "[1]*99999*99999", "([1]*60000+[0])*2"):
        with pytest.raises(ValueError):
            parse_layer_freq(text)                       # no num_layers: MAX_PATTERN_LAYERS bounds it
    assert built == []
    with pytest.raises(ValueError, match="characters"):
        parse_layer_freq("[" + "1," * 6000 + "1]")      # longer than MAX_PATTERN_CHARS: not parsed


def test_no_eval_in_the_calculators():
    out = subprocess.run([sys.executable, "-c", "import ast, pathlib, labkit.calc as c; "
                          "print([p.name for p in pathlib.Path(c.__file__).parent.glob('*.py') "
                          "if any(isinstance(n, ast.Call) and getattr(n.func, 'id', '') in ('eval', 'exec') "
                          "for n in ast.walk(ast.parse(p.read_text())))])"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_estimate_cli_refuses_a_huge_pattern_in_one_line(capsys):
    from labkit.calc import cli
    small = ["--world-size", "8", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
             "--vocab-size", "256", "--seq-length", "64", "--micro-batch-size", "1", "--num-experts", "4"]
    assert cli.main(small + ["--moe-layer-freq", "[1]*10**8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --moe-layer-freq: ") and len(err) < 200
    assert cli.main(small + ["--moe-layer-freq", "([1]+[0])*2"]) == 0
