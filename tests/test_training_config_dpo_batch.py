"""The DPO step's micro-batching keeps the optimisation step's pairs."""

import pytest

from coevolve.training.config import TrainingConfig
from coevolve.training.dpo_config import DpoConfig
from coevolve.training.dpo_trainer import dpo_arguments


@pytest.mark.parametrize(
    ("batch", "accumulation", "micro", "expected"),
    [
        (8, 1, 2, (2, 4)),  # the default: 8 pairs a step, 2 per forward pass
        (8, 2, 2, (2, 8)),  # accumulation the user set multiplies
        (6, 1, 4, (3, 2)),  # the largest divisor of batch_size up to the micro size
        (7, 1, 2, (1, 7)),
        (2, 1, 4, (2, 1)),  # a batch smaller than the micro size runs as it is
        (8, 1, None, (8, 1)),  # None: every pair at once
    ],
)
def test_dpo_micro_batches_keep_the_pairs_per_step(batch, accumulation, micro, expected, tmp_path):
    config = TrainingConfig(
        batch_size=batch,
        gradient_accumulation_steps=accumulation,
        dpo=DpoConfig(micro_batch_size=micro),
    )
    arguments = dpo_arguments(config, "cpu", tmp_path, progress=False)
    assert (
        arguments["per_device_train_batch_size"],
        arguments["gradient_accumulation_steps"],
    ) == expected
    assert expected[0] * expected[1] == batch * accumulation
    assert arguments["max_length"] == config.max_length
    assert arguments["precompute_ref_log_probs"] is False
