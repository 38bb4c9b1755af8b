"""``python -m coevolve.training STEP_SPEC.json``: run one training step from its spec.

The loop starts this (``training.launcher: subprocess``), once per process under
``accelerate launch`` (``launcher: accelerate``); see ``coevolve.training.launch``.
Output goes to stdout, which the loop copies into the run's log file: the
trainer's per-step log lines from the main process, warnings from every rank.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m coevolve.training",
        description="Train one cycle's LoRA adapter from a step spec written by the loop.",
    )
    parser.add_argument("spec", type=Path, help="the step spec (TrainingStepSpec as JSON)")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    # The same line format as the run's log (outputs/run_log.py); the parent counts steps by it.
    logging.basicConfig(
        stream=sys.stdout,
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s %(name)s %(levelname)s: [rank {rank}] %(message)s",
    )
    # Fails on a bad path or spec before torch is imported.
    from .launch import TrainingStepSpec, run_spec

    spec = TrainingStepSpec.model_validate_json(args.spec.read_text())
    result = run_spec(spec)
    logging.getLogger("coevolve.training").info("training step done: %s", result.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
