"""The commands the README and docs show, checked as a user would meet them.

- Every ``coevolve ...`` line in a shell block of README.md or docs/*.md names a real
  command with options the command takes: a renamed option or command fails here, not
  in a user's terminal.
- Every command of the README's tour runs for real (slow), on the tiny model where the
  README's runs SmolLM2, or with ``--dry-run``; ``TOUR`` says how each one is run here, or
  why it cannot run without a GPU or a vLLM server. A tour line missing from ``TOUR``
  fails the test, so a new documented command comes with its check.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from coevolve.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]  # bench pages too
_FENCE = re.compile(r"^```(\w*)\s*$")


def shell_commands(text: str) -> list[str]:
    """The ``coevolve`` command lines of a Markdown text's bash/sh/console blocks, with
    continuation lines joined and comments and prompts dropped."""
    commands: list[str] = []
    in_shell = False
    pending = ""
    for line in text.splitlines():
        fence = _FENCE.match(line.strip())
        if fence:
            in_shell = not in_shell and fence.group(1) in ("bash", "sh", "shell", "console")
            pending = ""
            continue
        if not in_shell:
            continue
        line = pending + line.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        line = line.removeprefix("$ ")
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            tokens = list(lexer)
        except ValueError:
            continue
        # One line may chain commands: `a && b`, `a | b`, `a; b`.
        words: list[str] = []
        for token in [*tokens, ";"]:
            if token not in ("&&", "||", ";", "|", "&"):
                words.append(token)
                continue
            # `.venv/bin/coevolve ...` and `coevolve ...`; env assignments before it are fine
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                words = words[1:]
            if words and words[0].split("/")[-1] == "coevolve":
                # "..." stands for options the text leaves out
                kept = [word for word in words[1:] if word != "..."]
                commands.append(shlex.join(["coevolve", *kept]))
            words = []
    return commands


def documented_commands() -> dict[str, list[str]]:
    """Command line -> the documents that show it."""
    found: dict[str, list[str]] = {}
    for path in DOCUMENTS:
        for command in shell_commands(path.read_text()):
            found.setdefault(command, []).append(path.relative_to(ROOT).as_posix())
    return found


def readme_tour() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("## A tour of the commands")
    end = text.index("\n## ", start + 1)
    return shell_commands(text[start:end])


def parse_error(command: str) -> str | None:
    """What the real command tree says of ``command`` when it parses it as it does before
    running it (unknown command or option, a missing argument, a bad value); None if it
    parses."""
    words = shlex.split(command)[1:]
    node: Any = typer.main.get_command(app)
    path = ["coevolve"]
    while hasattr(node, "commands") and words and not words[0].startswith("-"):
        name = words.pop(0)
        if name not in node.commands:
            return f"no command {' '.join([*path, name])!r}"
        node = node.commands[name]
        path.append(name)
    try:
        node.make_context(" ".join(path), words)
    except Exception as err:  # typer's vendored click: UsageError and its kinds
        if not hasattr(err, "format_message"):
            raise
        return str(err.format_message())
    return None


def test_the_tour_is_found():
    tour = readme_tour()
    assert any(line.startswith("coevolve bootstrap") for line in tour)
    assert len(tour) >= 15


def test_a_bad_command_line_does_not_parse():
    assert parse_error("coevolve env check world --split heldout") is None
    assert "--bogus" in str(parse_error("coevolve bootstrap --bogus"))
    assert "no command 'coevolve evl'" == parse_error("coevolve evl")
    assert "--max-stepz" in str(parse_error("coevolve eval --max-stepz 3"))
    assert parse_error("coevolve synthesize") is not None  # its argument is missing


@pytest.mark.parametrize("command", sorted(documented_commands()))
def test_documented_command_parses(command):
    error = parse_error(command)
    if error is not None:
        where = ", ".join(sorted(set(documented_commands()[command])))
        pytest.fail(f"{where}: `{command}`: {error}")


# --------------------------------------------------------------------------- the tour, run

# How each tour line runs here. {model}: the tiny bootstrap model's directory (the README's
# `--policy bootstrap` is SmolLM2 LoRA-trained for minutes); {tmp}: the test's directory.
# A string instead of arguments says why the line cannot run on a CPU without servers.
TOUR: dict[str, list[str] | str] = {
    "coevolve env list": ["env", "list"],
    "coevolve env list examples.support_desk.env:make_env": [
        "env", "list", "examples.support_desk.env:make_env",
    ],
    "coevolve env show world --split heldout --index 3": [
        "env", "show", "world", "--split", "heldout", "--index", "3",
    ],
    "coevolve env check world": ["env", "check", "world", "--split", "validation"],
    "coevolve env check bfcl --category multi_turn_base": [
        "env", "check", "bfcl", "--category", "multi_turn_base",
    ],
    "coevolve env vary world --limit 100": ["env", "vary", "world", "--limit", "10"],
    "coevolve env prompts examples.support_desk.env:make_env": [
        "env", "prompts", "examples.support_desk.env:make_env",
    ],
    "coevolve bootstrap": [
        "bootstrap", "--config", "{tmp}/bootstrap-default-eval.yaml", "--cache-dir", "{tmp}/cache",
    ],
    "coevolve bootstrap --base tiny --json": [
        "bootstrap", "--base", "tiny", "--json", "--cache-dir", "{tmp}/cache",
    ],
    "coevolve eval --env world --split heldout --policy bootstrap": [
        "eval", "--env", "world", "--split", "heldout", "--policy", "{model}", "--limit", "4",
    ],
    "coevolve eval --env world --split heldout --policy oracle": [
        "eval", "--env", "world", "--split", "heldout", "--policy", "oracle",
    ],
    "coevolve eval --env bfcl --category multi_turn_base --policy configs/vllm.yaml --json": (
        "a vLLM server (coevolve serve configs/vllm.yaml): "
        "tests/test_real_server.py runs eval against a real OpenAI-compatible server"
    ),
    "coevolve eval --env world --split train --k 4 --temperature 0.9 --limit 128 "
    "--policy bootstrap --save runs/demo/rollouts.jsonl": [
        "eval", "--env", "world", "--split", "train", "--k", "2", "--temperature", "0.9",
        "--limit", "6", "--policy", "{model}", "--save", "{tmp}/runs/demo/rollouts.jsonl",
    ],
    "coevolve eval --policy runs/support-desk/adapters/cycle-3": (
        "a finished run of the example (make example): tests/test_user_env.py evaluates the "
        "tiny model's run's adapter this way"
    ),
    "coevolve synthesize runs/demo/rollouts.jsonl": [
        "synthesize", "{tmp}/runs/demo/rollouts.jsonl", "--store", "{tmp}/store",
    ],
    "coevolve serve configs/llama-cpp.yaml --endpoint larger --dry-run": [
        "serve", "configs/llama-cpp.yaml", "--endpoint", "larger", "--dry-run",
    ],
    "coevolve bench learning --seeds 3": [
        "bench", "learning", "--quick", "--seeds", "1", "--arms", "static",
        "--out", "{tmp}/bench",
    ],
    "coevolve bench by-seed-tasks 100=A/report.json 400=B/report.json": [
        "bench", "by-seed-tasks", "1={tmp}/bench/report.json", "--out", "{tmp}/by-n.png",
    ],
    "coevolve eval --env bfcl --category multi_turn_base --policy configs/bfcl.yaml "
    "--report bfcl.json": (
        "SmolLM2 on 200 BFCL tasks (tens of minutes on 2 cores); the eval path itself runs above"
    ),
    "coevolve export runs/quickstart runs/quickstart-data --format hf": (
        "a finished run directory: tests/test_cycle.py exports the tiny model's run"
    ),
    "coevolve studio": "a long-running server: tests/test_studio.py starts it and calls it",
    "coevolve serve configs/vllm.yaml --dry-run": [
        "serve", "configs/vllm.yaml", "--dry-run",
    ],
    "coevolve config show configs/offline.yaml": ["config", "show", "configs/offline.yaml"],
}  # fmt: skip


def test_every_tour_line_says_how_it_runs_here():
    missing = [line for line in readme_tour() if line not in TOUR]
    assert not missing, f"README tour lines without a check in TOUR: {missing}"


@pytest.mark.slow
def test_the_tour_runs(tiny_build, tmp_path):
    import shutil

    import yaml

    from coevolve.testing.presets import load_preset

    pytest.importorskip("bfcl_eval")
    section = load_preset("bootstrap-tiny")
    del section["eval_split"]  # `coevolve bootstrap` evaluates on validation by default
    section["eval_per_family"] = 1
    (tmp_path / "bootstrap-default-eval.yaml").write_text(yaml.safe_dump({"bootstrap": section}))
    # Both `coevolve bootstrap` lines name the tiny model the session built (its cache key):
    # they find it in their cache, and the first evaluates it. tests/test_bootstrap.py builds
    # through the command.
    shutil.copytree(tiny_build, tmp_path / "cache" / "bootstrap" / tiny_build.name)
    ran = []
    for line in readme_tour():
        how = TOUR[line]
        if isinstance(how, str):
            continue
        args = [arg.format(model=tiny_build, tmp=tmp_path) for arg in how]
        result = subprocess.run(
            [sys.executable, "-m", "coevolve", *args],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
        assert result.returncode == 0, f"`{line}` (run as {args}): {result.stderr[-2000:]}"
        ran.append(line)
    assert len(ran) >= 12
    assert (tmp_path / "runs/demo/rollouts.jsonl").stat().st_size > 0
