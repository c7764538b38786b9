"""book/glossary.md is the one glossary of book and code (STYLE.md, principle 13).

It must define every field of ``labkit.training.TrainConfig`` (the Megatron-LM argument names a
reader meets in every lab), the core vocabulary of the course, and every {term} a page links to.
The glossary is parsed the way Sphinx's ``glossary`` directive reads it: inside a ``{glossary}``
fence, lines that start in column 0 are terms (several in a row share one definition), indented
lines are the definition. No processes, no book build: tier-1 tests.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from labkit.training import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
GLOSSARY = ROOT / "book" / "glossary.md"

# Core vocabulary the issue asks the glossary to define (term text, as written in the glossary).
CORE_TERMS = [
    "tp", "pp", "dp", "cp", "ep", "mb", "micro_batch_size", "global_batch_size", "num_microbatches",
    "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "num_layers_per_virtual_pipeline_stage", "context_parallel_size", "expert_model_parallel_size",
    "sequence_parallel", "use_distributed_optimizer", "zero_stage", "ddp_bucket_size",
    "bubble", "flush", "MFU", "HFU", "f and g", "conjugate", "all-reduce", "all-gather",
    "reduce-scatter", "all-to-all", "p2p", "rank", "world_size", "group", "axis", "shard",
    "replica", "ZeRO-1", "ZeRO-2", "ZeRO-3", "FSDP", "1F1B", "GPipe", "interleaved schedule",
    "virtual stage", "warm-up", "steady state", "cool-down", "activation recomputation",
    "s", "b", "h", "a", "L", "V",
]


def parse_glossary(text: str) -> list[tuple[list[str], str]]:
    """Entries of every ```{glossary} fence in ``text``: (terms without backticks, definition)."""
    entries: list[tuple[list[str], str]] = []
    for block in re.findall(r"^```\{glossary\}[^\n]*\n(.*?)^```", text, re.M | re.S):
        terms: list[str] = []
        definition: list[str] = []
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith(":"):  # blank line or directive option
                continue
            if line[0].isspace():
                definition.append(line.strip())
                continue
            if definition:  # a term after a definition starts the next entry
                entries.append((terms, " ".join(definition)))
                terms, definition = [], []
            terms.append(line.strip().strip("`"))
        if terms:
            entries.append((terms, " ".join(definition)))
    return entries


def all_terms(entries) -> list[str]:
    return [t for terms, _ in entries for t in terms]


def missing(names, entries) -> list[str]:
    """Names that are not a term of ``entries`` (exact match: code names are case-sensitive)."""
    have = set(all_terms(entries))
    return [n for n in names if n not in have]


@pytest.fixture(scope="module")
def entries():
    return parse_glossary(GLOSSARY.read_text())


def test_every_trainconfig_field_is_a_glossary_term(entries):
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    assert len(fields) >= 20  # the config really was read
    assert missing(fields, entries) == [], "add these TrainConfig fields to book/glossary.md"


def test_core_vocabulary_is_defined(entries):
    assert missing(CORE_TERMS, entries) == []


def test_entries_have_definitions_and_terms_are_unique(entries):
    assert len(entries) >= 60
    empty = [terms for terms, definition in entries if len(definition.split()) < 5]
    assert empty == [], "every entry needs a definition of a sentence or more"
    terms = all_terms(entries)
    duplicates = sorted({t for t in terms if terms.count(t) > 1})
    assert duplicates == []


def test_every_term_link_in_the_book_resolves(entries):
    """{term}`x` and {term}`text <x>` in book/ and labs/ must name a glossary term. Sphinx matches
    exactly first, then ignoring case; a miss is a build warning, so an error under -W."""
    known = {t.lower() for t in all_terms(entries)}
    role = re.compile(r"\{term\}`([^`]*)`")
    broken = []
    for path in sorted([*ROOT.glob("book/**/*.md"), *ROOT.glob("book/**/*.ipynb"),
                        *ROOT.glob("labs/**/*.ipynb")]):
        if "_build" in path.parts or ".ipynb_checkpoints" in path.parts:
            continue
        for target in role.findall(path.read_text()):
            m = re.fullmatch(r"(?s).*<(.+)>\s*", target)
            name = (m.group(1) if m else target).strip()
            if name.lower() not in known:
                broken.append(f"{path.relative_to(ROOT)}: {name}")
    assert broken == []


# The checks above must be able to fail: run the same parser on glossaries that are wrong.
BAD = """
```{glossary}
`micro_batch_size`
b
  Microbatch size: samples per forward and backward.

`lr`
```
"""


def test_parser_reports_a_missing_field_and_an_empty_definition():
    entries = parse_glossary(BAD)
    assert entries == [(["micro_batch_size", "b"], "Microbatch size: samples per forward and backward."),
                       (["lr"], "")]
    assert missing(["micro_batch_size", "global_batch_size", "lr"], entries) == ["global_batch_size"]
    assert missing(["B"], entries) == ["B"]  # symbols are case-sensitive: b is not B


def test_parser_reads_the_real_trainconfig_and_would_fail_without_an_entry(entries):
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    without = [(terms, d) for terms, d in entries if "micro_batch_size" not in terms]
    assert missing(fields, without) == ["micro_batch_size"]
