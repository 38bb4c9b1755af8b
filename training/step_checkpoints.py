"""A training step's trainer checkpoints (``training.checkpoint_every``): where they live,
keyed by the step's settings, and which one a killed step resumes from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .config import TrainingConfig

CHECKPOINTS_FOLDER = ".checkpoints"
CHECKPOINT_KEY_FILE = "step-key.json"


def step_checkpoints(
    config: TrainingConfig,
    output: Path,
    model_dir: str | Path,
    previous_adapter: str | Path | None,
    *sizes: int,
) -> tuple[Path | None, str | None]:
    """(the folder of this step's trainer checkpoints, the last checkpoint to resume from)
    under ``training.checkpoint_every``; (None, None) without it. The folder,
    ``<adapters>/.checkpoints/<adapter name>/``, is keyed by the step's settings, base,
    previous adapter and data sizes: checkpoints of another step are removed, not resumed."""
    if not config.checkpoint_every:
        return None, None
    import hashlib

    from transformers.trainer_utils import get_last_checkpoint

    folder = output.parent / CHECKPOINTS_FOLDER / output.name
    key = hashlib.sha256(
        json.dumps(
            [
                config.model_dump(mode="json"),
                str(model_dir),
                str(previous_adapter),
                list(sizes),
            ],
            sort_keys=True,
        ).encode()
    ).hexdigest()
    key_file = folder / CHECKPOINT_KEY_FILE
    try:
        same = json.loads(key_file.read_text()).get("key") == key
    except (OSError, ValueError):
        same = False
    if not same:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        key_file.write_text(json.dumps({"key": key}) + "\n")
        return folder, None
    return folder, get_last_checkpoint(str(folder))


def checkpoint_step(checkpoint: str | None) -> int | None:
    """The step of a ``checkpoint-N`` folder (None for none)."""
    if checkpoint is None:
        return None
    return int(Path(checkpoint).name.rsplit("-", 1)[1])
