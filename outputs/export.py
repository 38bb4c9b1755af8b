"""`coevolve export`: a run's synthesized tasks and training examples, as datasets.

Three tables, each written only when the run has rows for it:

- ``tasks``: every synthesized task the run accepted, with its provenance in
  separate fields (``source``, ``parent_task_id``, ``signal``, ``cycle``);
  nested parts (turns with reference calls, the initial state) are JSON strings,
  so every row has the same columns;
- ``sft``: each cycle's SFT conversations as TRL's SFTTrainer reads them:
  ``messages`` (OpenAI messages, tool-call arguments as JSON strings) and
  ``tools`` (the tool schemas the prompt carried, as a JSON string, or null),
  with the example's ``weight`` and its ``cycle``;
- ``dpo``: each cycle's preference pairs as TRL's DPOTrainer reads them: ``prompt``,
  ``chosen``, ``rejected`` (messages of one ``task_id``) and ``tools`` (a JSON string, or
  null), with the ``cycle``; the token ids the rollouts kept (``chosen_turns``,
  ``rejected_turns``, coevolve's own token-exact DPO) are left out;
- ``grpo``: each GRPO cycle's prompts as TRL's GRPOTrainer reads them: ``prompt`` (the
  opening messages of an episode), ``tools`` (the task's tool schemas, a JSON string; the
  trainer takes its tools as callables, a reward function reads this column) and
  ``task_id``, with the ``cycle``.

Every table is what TRL's trainer takes as it is (tests/test_export_trl.py trains one step
on each).

Tables with different columns are different datasets, so each is its own
configuration (the Hub's convention): ``OUT/README.md`` declares them, and
``datasets.load_dataset(OUT, "sft", split="train")`` loads one. ``jsonl``
writes ``OUT/<table>.jsonl``; ``hf`` writes ``OUT/<table>.parquet``. Either
directory can be pushed to the Hub as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from ..common.files import dump_jsonl, write_atomically
from ..records import Task
from ..run_files import CONFIG_FILE, RunFiles

ExportFormat = Literal["jsonl", "hf"]


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
    files = RunFiles(run)
    if not files.config.is_file():
        raise FileNotFoundError(f"{run} is not a run directory (it has no {CONFIG_FILE})")
    tasks = files.read_synthesized_tasks()
    sft: list[dict[str, Any]] = []
    dpo: list[dict[str, Any]] = []
    grpo: list[dict[str, Any]] = []
    for cycle_files in files.cycles():
        cycle = cycle_files.cycle
        for row in cycle_files.train_data():
            # a JSON string: tool schemas differ in their keys, and Arrow would merge them
            # into one struct padded with nulls (TRL's trainers read the string)
            tools = row.get("tools")
            tools_json = json.dumps(tools, ensure_ascii=False) if tools else None
            if "messages" in row:
                weight = row.get("weight", 1.0)
                sft.append(
                    {
                        "messages": row["messages"],
                        "tools": tools_json,
                        "weight": float(weight) if isinstance(weight, int | float) else 1.0,
                        "cycle": cycle,
                    }
                )
            elif "chosen" in row:
                dpo.append(
                    {
                        "prompt": row["prompt"],
                        "chosen": row["chosen"],
                        "rejected": row["rejected"],
                        "tools": tools_json,
                        "task_id": row.get("task_id"),
                        "cycle": cycle,
                    }
                )
            elif "prompt" in row:
                grpo.append(
                    {
                        "prompt": row["prompt"],
                        "tools": tools_json,
                        "task_id": row.get("task_id"),
                        "cycle": cycle,
                    }
                )
    tables = {
        "tasks": [task_row(task) for task in tasks],
        "sft": sft,
        "dpo": dpo,
        "grpo": grpo,
    }
    return {name: rows for name, rows in tables.items() if rows}


def export_run(
    run_dir: str | Path, out: str | Path, format: ExportFormat = "jsonl"
) -> dict[str, int]:
    """Write the run's tables to ``out``; returns the row count per table."""
    tables = export_tables(run_dir)
    if not tables:
        raise ValueError(f"{run_dir} has no synthesized tasks or training examples to export")
    if format not in ("jsonl", "hf"):
        raise ValueError(f"unknown export format {format!r}; allowed: jsonl, hf")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "jsonl" if format == "jsonl" else "parquet"
    for name, rows in tables.items():
        if format == "jsonl":
            dump_jsonl(out / f"{name}.jsonl", rows)
        else:
            from datasets import Dataset

            Dataset.from_list(rows).to_parquet(str(out / f"{name}.parquet"))
    write_atomically(out / "README.md", dataset_card(run_dir, list(tables), suffix))
    return {name: len(rows) for name, rows in tables.items()}


def dataset_card(run_dir: str | Path, tables: list[str], suffix: str) -> str:
    """README.md with one configuration per table, as the Hub and load_dataset read it."""
    configs = "".join(
        f"- config_name: {name}\n  data_files:\n  - split: train\n    path: {name}.{suffix}\n"
        for name in tables
    )
    return (
        f"---\nconfigs:\n{configs}---\n\n# coevolve export of {Path(run_dir).name}\n\n"
        'One configuration per table (`load_dataset(DIR, NAME, split="train")`): '
        + ", ".join(f"`{name}`" for name in tables)
        + ". See coevolve's export.py for the columns.\n"
    )


class HubPushError(RuntimeError):
    """A push to the Hugging Face Hub that could not be made; the message is one line."""


def push_tables(run_dir: str | Path, repo: str, private: bool = False) -> dict[str, int]:
    """Push the run's tables to the Hub dataset ``repo``, one configuration per table
    (``Dataset.push_to_hub(repo, config_name=NAME)``); returns the row count per table."""
    from huggingface_hub import constants

    tables = export_tables(run_dir)
    if not tables:
        raise ValueError(f"{run_dir} has no synthesized tasks or training examples to export")
    if constants.HF_HUB_OFFLINE:
        raise HubPushError(
            f"cannot push to {repo}: the Hugging Face Hub is offline here (HF_HUB_OFFLINE is "
            "set); export to a directory and push it from a machine that reaches the Hub"
        )
    from datasets import Dataset

    for name, rows in tables.items():
        try:
            Dataset.from_list(rows).push_to_hub(
                repo, config_name=name, split="train", private=private
            )
        except Exception as err:  # no network, no token, no permission, a bad repo name
            detail = str(err).strip().splitlines()[0] if str(err).strip() else "no detail"
            raise HubPushError(
                f"cannot push table {name!r} to {repo}: {type(err).__name__}: {detail}"
            ) from None
    return {name: len(rows) for name, rows in tables.items()}
