"""training.checkpoint_every: a long training step saves trainer checkpoints, and a step
killed inside its launched process continues from the last one (issue 58)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.testing.presets import tiny_training
from coevolve.training.config import TrainingConfig
from coevolve.training.datasets import reference_conversation


def test_checkpoint_every_sets_the_trainer_to_save_steps(tmp_path):
    from coevolve.training.trainer_common import common_arguments

    plain = common_arguments(tiny_training(), "cpu", tmp_path, progress=False)
    assert plain["save_strategy"] == "no"
    saving = common_arguments(tiny_training(checkpoint_every=5), "cpu", tmp_path, progress=False)
    assert (saving["save_strategy"], saving["save_steps"], saving["save_total_limit"]) == (
        "steps",
        5,
        1,
    )
    with pytest.raises(ValueError):
        TrainingConfig(checkpoint_every=0)


@pytest.mark.slow
def test_a_step_killed_inside_its_launched_process_continues_from_its_checkpoint(
    tiny_build, tmp_path
):
    from coevolve.training.adapters import is_adapter_complete
    from coevolve.training.launch import TrainingStepSpec, launch_spec
    from coevolve.training.step_checkpoints import CHECKPOINTS_FOLDER

    conversations = [
        reference_conversation(WorldEnvironment(), task)[0] for task in load_split("train")[:8]
    ]
    config = tiny_training(launcher="subprocess", max_steps=16, batch_size=2, checkpoint_every=4)
    adapter = tmp_path / "adapters" / "cycle-1"
    step = tmp_path / "cycles" / "001" / "train-step.json"
    spec = TrainingStepSpec(
        config=config,
        model_dir=str(tiny_build),
        output_dir=str(adapter),
        conversations=conversations,
        seed=3,
        result_file=str(step.with_suffix(".result.json")),
    )
    step.parent.mkdir(parents=True)
    step.write_text(spec.model_dump_json())
    checkpoints = tmp_path / "adapters" / CHECKPOINTS_FOLDER / "cycle-1"
    child = subprocess.Popen(
        [sys.executable, "-m", "coevolve.training", str(step)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.monotonic() + 300

    # Kill it once a checkpoint from step 8 on is whole (trainer_state.json is written last)
    # and the one before it is rotated away: between the two a kill would find both, on
    # a loaded machine as often as not.
    def settled() -> bool:
        saved = list(checkpoints.glob("checkpoint-*"))
        return (
            len(saved) == 1
            and int(saved[0].name.rsplit("-", 1)[1]) >= 8
            and (saved[0] / "trainer_state.json").exists()
        )

    while not settled():
        assert child.poll() is None, "the step ended before its second checkpoint"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert not is_adapter_complete(adapter)  # killed inside the step
    saved = sorted(p.name for p in checkpoints.glob("checkpoint-*"))
    last = max(int(name.rsplit("-", 1)[1]) for name in saved)
    assert last >= 8 and len(saved) == 1  # the last one kept

    # The run resumes: the same step, launched again, continues from that checkpoint.
    result = launch_spec(spec, step, tmp_path / "run.log", progress=False)
    assert result.resumed_from_step == last and result.steps == 16
    assert is_adapter_complete(adapter)
    stored = json.loads((adapter / "training.json").read_text())["result"]
    assert stored["resumed_from_step"] == last
    assert not checkpoints.exists()  # done: the checkpoints are removed

    # Checkpoints of another step (other settings) are not resumed.
    from coevolve.training.trainers import step_checkpoints

    folder, resume = step_checkpoints(config, adapter, tiny_build, None, 8, 0, 0)
    (folder / "checkpoint-4").mkdir()
    (folder / "checkpoint-4" / "trainer_state.json").write_text("{}")
    assert step_checkpoints(config, adapter, tiny_build, None, 8, 0, 0)[1] is not None
    other = config.model_copy(update={"learning_rate": 0.5})
    assert step_checkpoints(other, adapter, tiny_build, None, 8, 0, 0) == (folder, None)
    assert resume is None
