"""Benchmark: one SFT step trained by 1 process and by 2 DDP processes (gloo, CPU), same global batch.

    OMP_NUM_THREADS=1 .venv/bin/python bench/ddp.py [--model DIR] [--steps 30] [--global-batch 16]

Trains ``--steps`` LoRA SFT steps on reference conversations of world train tasks
through the loop's own launcher (``training.launch``): ``launcher: subprocess``
with ``batch_size = global batch``, then ``launcher: accelerate`` with
``configs/accelerate/ddp-cpu.yaml`` (2 processes) and ``batch_size = global batch / 2``.
Prints the loss of every step side by side (rank 0's logged loss, which the
trainer averages over the ranks), seconds per step of the training loop, and
the wall time of the whole launched step (process start, model load,
tokenization, training, save). The model defaults to the tiny test bootstrap
(training/presets/bootstrap-tiny.yaml), built into a temporary cache. Not run by
the tests.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

STEP_LINE = re.compile(r"coevolve\.trainer INFO: \[rank 0\] step (\d+): (\{.*'loss':.*\})")


def losses(log: Path) -> list[float]:
    """The loss of every step, from rank 0's trainer log lines."""
    found = []
    for line in log.read_text().splitlines():
        match = STEP_LINE.search(line)
        if match:
            found.append(float(ast.literal_eval(match[2])["loss"]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model directory (default: tiny bootstrap)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--tasks", type=int, default=128, help="world train tasks to train on")
    args = parser.parse_args()
    if args.global_batch % 2:
        parser.error("--global-batch must be even (2 processes share it)")

    from coevolve.agents.policy.conversation import reference_conversation
    from coevolve.envs.world import WorldEnvironment, load_split
    from coevolve.run_files import LOG_FILE
    from coevolve.training.config import TrainingConfig
    from coevolve.training.launch import launch_train_adapter
    from coevolve.training.tiny_presets import tiny_training

    work = Path(tempfile.mkdtemp(prefix="coevolve-bench-ddp-"))
    if args.model is None:
        from coevolve.training.bootstrap.build import bootstrap
        from coevolve.training.tiny_presets import tiny_bootstrap

        model_dir = bootstrap(tiny_bootstrap(), cache_dir=work / "cache", progress=False)
    else:
        model_dir = Path(args.model)
    conversations = [
        reference_conversation(WorldEnvironment(), task)[0]
        for task in load_split("train")[: args.tasks]
    ]
    base = tiny_training().model_dump() | {"max_steps": args.steps}
    runs = {
        "1 process": base | {"launcher": "subprocess", "batch_size": args.global_batch},
        "2 processes": base
        | {"launcher": "accelerate", "accelerate_config": "ddp-cpu", "num_processes": 2}
        | {"batch_size": args.global_batch // 2},
    }
    curves, figures = {}, {}
    for name, settings in runs.items():
        folder = work / name.replace(" ", "-")
        started = time.perf_counter()
        result = launch_train_adapter(
            TrainingConfig.model_validate(settings),
            step_file=folder / "step.json",
            log_file=folder / LOG_FILE,
            progress=False,
            seed=0,
            model_dir=model_dir,
            output_dir=folder / "adapter",
            conversations=conversations,
        )
        wall = time.perf_counter() - started
        curves[name] = losses(folder / LOG_FILE)
        figures[name] = (result.world_size, result.train_time_s / result.steps, wall)

    print(
        f"model {model_dir}, {len(conversations)} conversations, global batch {args.global_batch}"
    )
    print(f"{'step':>4}  " + "  ".join(f"{name:>11}" for name in runs))
    for step in range(args.steps):
        row = [curves[name][step] if step < len(curves[name]) else float("nan") for name in runs]
        print(f"{step + 1:>4}  " + "  ".join(f"{loss:>11.4f}" for loss in row))
    print()
    for name, (world, per_step, wall) in figures.items():
        print(f"{name}: world size {world}, {per_step:.3f} s/step, {wall:.1f} s launched step")


if __name__ == "__main__":
    main()
