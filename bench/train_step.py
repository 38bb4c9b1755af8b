"""Benchmark: seconds and peak memory per SFT step of a cycle, by LoRA placement,
batching, micro-batch and activation checkpointing.

    .venv/bin/python bench/train_step.py --data runs/quickstart/cycles/001/train_data.jsonl \
        [--model DIR] [--steps 10] [--top-layers all,15,10] [--batching random,length_grouped] \
        [--micro-batch 8,4,2,1] [--checkpointing off,on]

Trains ``--steps`` LoRA SFT steps (batch 8, the quickstart's settings) on one
cycle's training data (``train_data.jsonl``, written by every cycle) through
the cycle's own ``train_adapter``, once per LoRA placement and batching: adapters in
every block (``all``) or only in the top N (backward stops at the lowest block
with an adapter, so fewer blocks means less work per step); batches shuffled
(``random``: each padded to its longest conversation) or ``length_grouped``.
Each is also run at every ``--micro-batch`` (conversations per forward pass; the
step still averages ``--batch-size``) and with ``--checkpointing`` off or on
(``training.activation_checkpointing``). Prints seconds per step, the peak resident
memory of the step (the kernel's high-water mark, reset before each variant, as
``bench/memory.py`` measures a stage), padded tokens per real token, and the ratios
to the first variant. The model defaults to the cached bootstrap agent
(``coevolve bootstrap`` builds it). Not run by the tests.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a cycle's train_data.jsonl")
    parser.add_argument("--model", default=None, help="model directory (default: bootstrap)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--top-layers", default="all,15,10")
    parser.add_argument("--batching", default="random,length_grouped")
    parser.add_argument("--micro-batch", default="8", help="conversations per forward pass")
    parser.add_argument("--checkpointing", default="off", help="off, on, or off,on")
    args = parser.parse_args()

    from coevolve.bench.memory import PeakMeter
    from coevolve.common.files import read_jsonl
    from coevolve.training.config import LoraAdapterConfig, TrainingConfig
    from coevolve.training.sft_config import SftConfig
    from coevolve.training.trainers import train_adapter

    if args.model is None:
        from coevolve.training.bootstrap.build import BootstrapConfig, bootstrap

        model_dir = bootstrap(BootstrapConfig())
    else:
        model_dir = Path(args.model)
    rows = read_jsonl(Path(args.data))
    conversations = [row["messages"] for row in rows]
    print(
        f"model {model_dir.name}, {len(conversations)} conversations, {args.steps} steps of "
        f"{args.batch_size}, torch threads {__import__('torch').get_num_threads()}"
    )
    from coevolve.common.tokenization import load_tokenizer
    from coevolve.training.trainers import length_grouped_order, sft_dataset

    lengths = [
        len(ids) for ids in sft_dataset(load_tokenizer(model_dir), conversations)["input_ids"]
    ]
    baseline = baseline_peak = None
    variants = [
        (placement, batching, int(micro), checkpointing == "on")
        for placement in args.top_layers.split(",")
        for batching in args.batching.split(",")
        for micro in args.micro_batch.split(",")
        for checkpointing in args.checkpointing.split(",")
    ]
    for placement, batching, micro, checkpointing in variants:
        top = None if placement == "all" else int(placement)
        config = TrainingConfig(
            max_steps=args.steps,
            batch_size=args.batch_size,
            learning_rate=5e-4,
            lora=LoraAdapterConfig(top_layers=top),
            sft=SftConfig(batching=batching, micro_batch_size=micro),
            activation_checkpointing=checkpointing,
        )
        rows = args.steps * args.batch_size
        if batching == "length_grouped":
            orders = [length_grouped_order(lengths, args.batch_size, rows, config.seed)]
        else:  # the trainer's own shuffle is not reproduced: average over 100 shuffles
            generator = random.Random(0)
            orders = [generator.sample(range(len(lengths)), len(lengths)) for _ in range(100)]
            orders = [(order * (rows // len(order) + 1))[:rows] for order in orders]
        padded = real = 0
        for order in orders:
            for start in range(0, rows, args.batch_size):
                batch = order[start : start + args.batch_size]
                padded += max(lengths[i] for i in batch) * len(batch)
                real += sum(lengths[i] for i in batch)
        with tempfile.TemporaryDirectory() as work, PeakMeter() as meter:
            result = train_adapter(
                config,
                model_dir=model_dir,
                output_dir=Path(work) / "adapter",
                conversations=conversations,
                progress=False,
            )
        per_step = result.train_time_s / max(result.steps, 1)
        peak = meter.peak() / 2**30
        baseline, baseline_peak = baseline or per_step, baseline_peak or peak
        print(
            f"lora in {placement:>3} blocks, {batching:>14}, {micro} a pass, "
            f"checkpointing {'on ' if checkpointing else 'off'}: {per_step:6.2f} s/step "
            f"x{per_step / baseline:.2f}  peak {peak:.2f} GiB x{peak / baseline_peak:.2f}  "
            f"padded/real tokens {padded / real:.2f}  (final loss {result.final_loss:.4f})"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
