"""`coevolve export`: a run's synthesized tasks and training examples, as datasets.

Three tables, each written only when the run has rows for it:

- ``tasks``: every synthesized task the run accepted, with its provenance in
  separate fields (``source``, ``parent_task_id``, ``signal``, ``cycle``);
  nested parts (turns with reference calls, the initial state) are JSON strings,
  so every row has the same columns;
- ``sft``: each cycle's SFT conversations (OpenAI messages, tool-call arguments
  as JSON strings), with the ``cycle``;
- ``dpo``: each cycle's preference pairs (``prompt``, ``chosen``, ``rejected``
  messages of one ``task_id``), with the ``cycle``.

``jsonl`` writes ``OUT/<table>.jsonl``; ``hf`` writes a ``datasets.DatasetDict``
with one split per table (``load_from_disk(OUT)``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from .files import dump_jsonl, load_jsonl, read_jsonl
from .records import Task

ExportFormat = Literal["jsonl", "hf"]
# Written by graph.training_step.train_cycle in each cycle directory.
TRAIN_DATA_FILE = "train_data.jsonl"


def task_row(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "env": task.env,
        "family": task.family,
        "instruction": task.instruction,
        "turns": json.dumps([turn.model_dump() for turn in task.turns], ensure_ascii=False),
        "reference_answer": task.reference_answer,
        "setup": json.dumps(task.setup, ensure_ascii=False),
        "source": task.source,
        "parent_task_id": task.parent_task_id,
        "signal": task.signal,
        "cycle": task.cycle,
    }


def export_tables(run_dir: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The run's tables (see the module docstring); empty tables are left out."""
    run = Path(run_dir)
    if not (run / "config.yaml").is_file():
        raise FileNotFoundError(f"{run} is not a run directory (it has no config.yaml)")
    tasks_file = run / "synthesized_tasks.jsonl"
    tasks = load_jsonl(tasks_file, Task) if tasks_file.exists() else []
    sft: list[dict[str, Any]] = []
    dpo: list[dict[str, Any]] = []
    for cycle_dir in sorted((run / "cycles").glob("[0-9][0-9][0-9]")):
        data = cycle_dir / TRAIN_DATA_FILE
        if not data.exists():
            continue
        cycle = int(cycle_dir.name)
        for row in read_jsonl(data):
            if "messages" in row:
                sft.append({"cycle": cycle, "messages": row["messages"]})
            else:
                dpo.append({"cycle": cycle, **row})
    tables = {"tasks": [task_row(task) for task in tasks], "sft": sft, "dpo": dpo}
    return {name: rows for name, rows in tables.items() if rows}


def export_run(
    run_dir: str | Path, out: str | Path, format: ExportFormat = "jsonl"
) -> dict[str, int]:
    """Write the run's tables to ``out``; returns the row count per table."""
    tables = export_tables(run_dir)
    if not tables:
        raise ValueError(f"{run_dir} has no synthesized tasks or training examples to export")
    out = Path(out)
    if format == "jsonl":
        for name, rows in tables.items():
            dump_jsonl(out / f"{name}.jsonl", rows)
    elif format == "hf":
        from datasets import Dataset, DatasetDict

        DatasetDict({name: Dataset.from_list(rows) for name, rows in tables.items()}).save_to_disk(
            str(out)
        )
    else:
        raise ValueError(f"unknown export format {format!r}; allowed: jsonl, hf")
    return {name: len(rows) for name, rows in tables.items()}
