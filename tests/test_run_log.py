"""A clean terminal: the trainers' per-step log dicts and the roles' INFO lines go to the
run's log file (RUN_DIR/run.log), not to stdout or stderr; --verbose shows them too."""

from __future__ import annotations

import logging

from coevolve.agents.policy.conversation import reference_conversation
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.outputs.run_log import run_log
from coevolve.run_files import LOG_FILE
from coevolve.testing.presets import tiny_training
from coevolve.training.trainers import train_adapter

ROLE_LOGGER = logging.getLogger("coevolve.synthesis")


def test_info_goes_to_the_file_warnings_to_the_terminal_too(tmp_path, capfd):
    # As in `coevolve run`: no logging set up by the application (pytest's own capture
    # handlers are put back before pytest removes them).
    root = logging.getLogger()
    pytest_handlers = root.handlers[:]
    root.handlers.clear()
    try:
        with run_log(tmp_path) as path:
            ROLE_LOGGER.info("an info line")
            ROLE_LOGGER.warning("a warning line")
    finally:
        root.handlers[:] = pytest_handlers
    ROLE_LOGGER.warning("after the run")  # the run's handlers are gone
    out, err = capfd.readouterr()
    assert path == tmp_path / LOG_FILE
    text = path.read_text()
    assert "coevolve.synthesis INFO: an info line" in text
    assert "coevolve.synthesis WARNING: a warning line" in text
    assert "after the run" not in text
    assert out == ""
    assert "an info line" not in err and "a warning line" in err
    assert not logging.getLogger("coevolve").handlers

    with run_log(tmp_path, verbose=True):
        ROLE_LOGGER.info("a verbose info line")
    assert "a verbose info line" in capfd.readouterr().err
    assert "a verbose info line" in path.read_text()  # appended to the same file


def _train(tiny_build, output, progress):
    env = WorldEnvironment()
    conversations = [reference_conversation(env, task)[0] for task in load_split("train")[:4]]
    return train_adapter(
        tiny_training(max_steps=2),
        model_dir=tiny_build,
        output_dir=output,
        conversations=conversations,
        progress=progress,
    )


def test_a_training_step_logs_its_dicts_to_the_run_log_only(tiny_build, tmp_path, capfd):
    with run_log(tmp_path) as path:
        result = _train(tiny_build, tmp_path / "adapter", progress=True)
    assert result.steps == 2
    out, err = capfd.readouterr()
    assert "{'loss'" not in out and "{'loss'" not in err
    logged = [line for line in path.read_text().splitlines() if "coevolve.trainer" in line]
    assert len(logged) >= 2 and all("{'loss'" in line for line in logged[:2]), logged
    assert "step 1: {'loss'" in logged[0]

    with run_log(tmp_path, verbose=True):
        _train(tiny_build, tmp_path / "again", progress=False)
    assert "{'loss'" in capfd.readouterr().err  # --verbose brings them back
