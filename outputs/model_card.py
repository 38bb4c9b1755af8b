"""Each cycle's adapter as the Hub takes it: ``adapters/cycle-N/README.md``, a model card.

The adapter directory is what PEFT saves (``adapter_config.json``,
``adapter_model.safetensors``): ``PeftModel.from_pretrained(base, "adapters/cycle-N")``
loads it, and ``huggingface-cli upload`` pushes it as it is. The card replaces PEFT's empty
template with the run's figures for that cycle (held-out success before and after, the
training step, the tasks synthesized) and how to load it. ``write_report`` writes the cards
when a run ends; a card describes one cycle and names the run's config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..run_files import RunFiles

CARD_FILE = "README.md"


def _percent(value: Any) -> str:
    return f"{100 * value:.1f}%" if isinstance(value, int | float) else "not evaluated"


def _hub_id(name: str) -> bool:
    """Whether a base model name is a Hub model id (the card's ``base_model`` field takes
    only those), not a local path."""
    return name.count("/") == 1 and not name.startswith(("/", ".", "~")) and "\\" not in name


def model_card(row: dict[str, Any], adapter: Path, baseline: dict[str, Any] | None) -> str:
    """The card of one cycle's adapter; ``row`` is its ``metrics.jsonl`` row."""
    config = json.loads((adapter / "adapter_config.json").read_text())
    base = str(config.get("base_model_name_or_path") or "")
    training: dict[str, Any] = {}
    if (adapter / "training.json").is_file():
        training = json.loads((adapter / "training.json").read_text())
    result, settings = training.get("result", {}), training.get("config", {})
    algorithm = result.get("algorithm") or settings.get("algorithm") or "unknown"
    front = ["---", "library_name: peft", "pipeline_tag: text-generation"]
    if _hub_id(base):
        front.append(f"base_model: {base}")
    front += ["tags:", "- coevolve", "- lora", "- trl", f"- {algorithm}", "---", ""]
    cycle = row["cycle"]
    figures = [
        ("held-out success after this cycle", _percent(row.get("heldout_success"))),
        (
            "held-out success of the starting agent (cycle 0)",
            _percent((baseline or {}).get("heldout_success")),
        ),
        ("held-out episodes", row.get("heldout_episodes")),
        ("rollout success this cycle", _percent(row.get("rollout_success"))),
        ("rollout episodes", row.get("rollout_episodes")),
        ("tasks synthesized and accepted", row.get("accepted")),
        ("task pool size", row.get("pool_size")),
        ("training algorithm", algorithm),
        ("training steps", row.get("train_steps")),
        ("training examples", row.get("train_examples")),
        ("final training loss", row.get("train_loss")),
        ("LoRA rank / alpha", _lora(settings)),
        ("learning rate", settings.get("learning_rate")),
        ("trained on", f"{result.get('device', '?')}, {result.get('world_size', 1)} process(es)"),
    ]
    lines = [
        *front,
        f"# coevolve adapter, cycle {cycle}",
        "",
        f"A LoRA adapter of `{base}` trained by coevolve (agent-data mutual evolution) in "
        f"cycle {cycle} of its run: rollouts on the task pool, failure signals, tasks "
        f"synthesized from them, then {algorithm.upper()} on the pool.",
        "",
        "| figure | value |",
        "|---|---|",
        *(f"| {name} | {'—' if value is None else value} |" for name, value in figures),
        "",
        "Held-out success is on the run's evaluation split, never seen by synthesis; the "
        "figures are one run's, with no interval (`coevolve bench learning` repeats runs).",
        "",
        "## Load it",
        "",
        "```python",
        "from peft import PeftModel",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f'base = AutoModelForCausalLM.from_pretrained("{base}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{base}")',
        f'model = PeftModel.from_pretrained(base, "{RunFiles(".").adapter(cycle)}")',
        "```",
        "",
    ]
    return "\n".join(lines)


def _lora(settings: dict[str, Any]) -> str | None:
    lora = settings.get("lora") or {}
    return f"{lora['r']} / {lora['alpha']}" if "r" in lora and "alpha" in lora else None


def write_model_cards(run_dir: str | Path, rows: list[dict[str, Any]]) -> list[Path]:
    """A card in each trained cycle's adapter directory; returns the cards written."""
    files = RunFiles(run_dir)
    baseline = next((row for row in rows if row["cycle"] == 0), None)
    written = []
    for row in rows:
        adapter = files.adapter(row["cycle"])
        if not row.get("train_steps") or not (adapter / "adapter_config.json").is_file():
            continue
        card = adapter / CARD_FILE
        card.write_text(model_card(row, adapter, baseline))
        written.append(card)
    return written
