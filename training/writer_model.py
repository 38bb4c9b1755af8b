"""The task writer, taught from the seed tasks: ``build_writer``.

Instruction back-translation (Humpback): each seed task's reference calls are replayed
in a fresh environment, rendered as the writer reads material in synthesis
(``agents.roles.task_writer.render_calls``: numbered calls with their results), and paired with the
task's request and answer (``render_writing``). A LoRA SFT of the base model on those
pairs, merged into its weights, is the writer; ``transformers serve`` (or vLLM) serves
the saved directory by its path, beside the policy, and ``synthesis.roles.writer`` names
that endpoint.

The writer learns from the tasks it is given and nothing else: the loop passes the
seed (train-split) tasks; no validation or held-out task is read here.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..agents.prompts import WRITER_PROMPT
from ..agents.roles.role_interfaces import Interaction
from ..agents.roles.task_writer import render_calls, render_writing
from ..common.files import atomic_directory
from ..envs.base import Environment
from ..records import Task
from .writer_config import WriterConfig

METADATA_FILE = "writer.json"


def writer_example(
    task: Task, make_env: Callable[[], Environment], prompt: str = WRITER_PROMPT
) -> list[dict[str, Any]] | None:
    """One training conversation (system, the replayed calls, the request), or None for a
    task the writer cannot read: several user turns, or no calls. A reference call that
    errs stays, with its error as its result (recovery families plan for one)."""
    if len(task.turns) != 1 or not task.turns[0].reference_calls:
        return None
    env = make_env()
    env.reset(task)
    interactions = [
        Interaction(call=call, observation=env.step(call)) for call in task.turns[0].reference_calls
    ]
    return [
        {"role": "system", "content": prompt},
        {"role": "user", "content": render_calls(interactions)},
        {
            "role": "assistant",
            "content": render_writing(task.turns[0].query, task.reference_answer),
        },
    ]


def writer_key(config: WriterConfig, base_dir: Path, tasks: Sequence[Task]) -> str:
    """The cache key of a writer: its settings, its base model and the tasks it learns."""
    payload = {
        "config": config.model_dump(mode="json"),
        "base": str(base_dir.resolve()),
        "tasks": [task.model_dump(mode="json") for task in tasks],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def build_writer(
    config: WriterConfig,
    *,
    base_dir: Path,
    tasks: Sequence[Task],
    make_env: Callable[[], Environment],
    cache_dir: Path,
    progress: bool = True,
) -> Path:
    """Train (or reuse) the writer of ``tasks``; return its model directory."""
    target = cache_dir / "writers" / writer_key(config, base_dir, tasks)
    if (target / METADATA_FILE).is_file():
        return target
    conversations = [c for t in tasks if (c := writer_example(t, make_env, config.prompt))]
    if not conversations:
        raise ValueError(f"none of the {len(tasks)} tasks has a single turn whose calls replay")
    from .config import LoraSettings, TrainingConfig
    from .sft_config import SftConfig
    from .trainers import train_merged

    started = time.perf_counter()
    training = TrainingConfig(
        algorithm="sft",
        lora=LoraSettings(r=config.lora_r, alpha=config.lora_alpha, dropout=0.0),
        learning_rate=config.learning_rate,
        lr_scheduler="cosine",
        warmup_ratio=0.05,
        max_steps=config.max_steps,
        batch_size=config.batch_size,
        max_length=config.max_length,
        seed=config.seed,
        device="cpu",
        sft=SftConfig(batching="random", micro_batch_size=config.micro_batch_size),
    )
    if progress:
        print(
            f"[writer] LoRA SFT of {base_dir.name}: {config.max_steps} steps of "
            f"{config.batch_size} from {len(conversations)} seed tasks (calls -> request)",
            flush=True,
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(target) as work:
        result, _ = train_merged(training, base_dir, work, conversations, progress)
        metadata = {
            "config": config.model_dump(mode="json"),
            "base": str(base_dir),
            "tasks": len(tasks),
            "examples": len(conversations),
            "task_ids": [task.id for task in tasks],
            "steps": result.steps,
            "final_loss": result.final_loss,
            "build_time_s": round(time.perf_counter() - started, 1),
        }
        (work / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    return target
