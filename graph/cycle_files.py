"""One cycle's files, ``<run_dir>/cycles/NNN/``: what each stage writes and a later one reads.

The cycle graph's state stays small (figures and the cycle number); the
trajectories, flagged items and tasks of a cycle pass between its nodes through
these files, written atomically, so a killed run resumes from them. This class
is the only place that knows their names:

    rollouts.jsonl           rollout     -> signals, train     (Trajectory; the episodes that ran)
    unreachable-STAGE.jsonl  rollout, evaluate: episodes the endpoint gave no reply for,
                             kept for a person to read (no stage reads them)
    flagged.jsonl            signals     -> synthesize, train  (FlaggedTrajectory)
    synthesized.jsonl        synthesis   -> update_pool, train (Task)
    rejections.jsonl         synthesis: every rejected item with its stage and reason
    train_data.jsonl         train: what the step trained on (``coevolve export``)
    train.json               train: the step's result, so a resumed run reuses it
    train-step.json          train: the step handed to a training process of its own
    eval.jsonl               evaluate: the evaluation episodes
    failure_rollouts.jsonl   hard negatives: the failure agent's episodes
    hard_negatives.json      hard negatives: the step's figures
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, JsonValue

from ..common.files import dump_jsonl, load_jsonl, read_jsonl, write_atomically
from ..memory.signals import FlaggedTrajectory
from ..records import Task, Trajectory

if TYPE_CHECKING:
    from ..training.hard_negative_pairs import HardNegativeFigures

Record = TypeVar("Record", bound=BaseModel)

CYCLES_FOLDER = "cycles"


class CycleFiles:
    """The files of cycle ``cycle`` of the run in ``run_dir`` (its folder is made by the
    first write)."""

    def __init__(self, run_dir: str | Path, cycle: int) -> None:
        self.run_dir = Path(run_dir)
        self.cycle = cycle
        self.folder = self.run_dir / CYCLES_FOLDER / f"{cycle:03d}"

    @classmethod
    def of_run(cls, run_dir: str | Path) -> list[CycleFiles]:
        """The cycles of a run that have a folder, in order."""
        folders = sorted((Path(run_dir) / CYCLES_FOLDER).glob("[0-9][0-9][0-9]"))
        return [cls(run_dir, int(folder.name)) for folder in folders]

    def __repr__(self) -> str:
        return f"CycleFiles({str(self.run_dir)!r}, {self.cycle})"

    def _path(self, name: str) -> Path:
        return self.folder / name

    def _write(self, name: str, records: Iterable[BaseModel | Mapping[str, object]]) -> None:
        dump_jsonl(self._path(name), records)

    def _read(self, name: str, model: type[Record]) -> list[Record]:
        """The records of a file; none when the stage has not written it."""
        path = self._path(name)
        return load_jsonl(path, model) if path.exists() else []

    # ----------------------------------------------------------------- rollout
    def rollouts(self) -> list[Trajectory]:
        return self._read("rollouts.jsonl", Trajectory)

    def write_rollouts(self, trajectories: Sequence[Trajectory]) -> None:
        self._write("rollouts.jsonl", trajectories)

    def unreachable(self, stage: str) -> list[Trajectory]:
        """The episodes of ``stage`` (rollout, evaluate) the endpoint gave no usable reply for."""
        return self._read(f"unreachable-{stage}.jsonl", Trajectory)

    def write_unreachable(self, stage: str, trajectories: Sequence[Trajectory]) -> None:
        """Keep a stage's left-out episodes for a person to read; a stage run again on
        resume replaces the file, and an empty list removes it."""
        path = self._path(f"unreachable-{stage}.jsonl")
        if trajectories:
            self._write(path.name, trajectories)
        elif path.exists():
            path.unlink()

    # ----------------------------------------------------------------- signals
    def flagged(self) -> list[FlaggedTrajectory]:
        return self._read("flagged.jsonl", FlaggedTrajectory)

    def write_flagged(self, items: Sequence[FlaggedTrajectory]) -> None:
        self._write("flagged.jsonl", items)

    # ----------------------------------------------------------------- synthesis
    def synthesized(self) -> list[Task]:
        return self._read("synthesized.jsonl", Task)

    def write_synthesized(self, tasks: Sequence[Task]) -> None:
        self._write("synthesized.jsonl", tasks)

    def write_rejections(self, rejections: Sequence[BaseModel]) -> None:
        self._write("rejections.jsonl", rejections)

    # ----------------------------------------------------------------- train
    @property
    def train_record(self) -> Path:
        """The step's result (a TrainResult, as JSON): present once the step finished."""
        return self._path("train.json")

    def write_train_record(self, result: BaseModel) -> None:
        write_atomically(self.train_record, result.model_dump_json(indent=2))

    def train_steps(self) -> int:
        """The optimiser steps the finished step took (0 before it finished)."""
        try:
            return int(json.loads(self.train_record.read_text()).get("steps") or 0)
        except (OSError, ValueError):
            return 0

    @property
    def train_step_spec(self) -> Path:
        """The step handed to a training process of its own (``training.launcher``)."""
        return self._path("train-step.json")

    def train_data(self) -> list[dict[str, JsonValue]]:
        """What the step trained on: SFT rows (messages, tools, weight) or DPO pairs."""
        path = self._path("train_data.jsonl")
        return list(read_jsonl(path)) if path.exists() else []

    def write_train_data(self, rows: Iterable[BaseModel | Mapping[str, object]]) -> None:
        self._write("train_data.jsonl", rows)

    # ----------------------------------------------------------------- evaluate
    @property
    def evaluation_episodes(self) -> Path:
        return self._path("eval.jsonl")

    def write_evaluation(self, trajectories: Sequence[Trajectory]) -> None:
        self._write("eval.jsonl", trajectories)

    # ----------------------------------------------------------------- hard negatives
    def has_failure_rollouts(self) -> bool:
        return self._path("failure_rollouts.jsonl").exists()

    def failure_rollouts(self) -> list[Trajectory]:
        return self._read("failure_rollouts.jsonl", Trajectory)

    def write_failure_rollouts(self, trajectories: Sequence[Trajectory]) -> None:
        self._write("failure_rollouts.jsonl", trajectories)

    def hard_negative_figures(self) -> HardNegativeFigures | None:
        path = self._path("hard_negatives.json")
        return json.loads(path.read_text()) if path.exists() else None

    def write_hard_negative_figures(self, figures: HardNegativeFigures) -> None:
        write_atomically(self._path("hard_negatives.json"), json.dumps(figures, indent=2) + "\n")
