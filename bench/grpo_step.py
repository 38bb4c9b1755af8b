"""Benchmark: seconds per GRPO step on SmolLM2-135M-Instruct, single-turn world and multi-turn BFCL.

    .venv/bin/python bench/grpo_step.py [--model DIR] [--kinds world,bfcl] [--steps 2] \
        [--prompts 2] [--generations 4] [--world-tokens 384] [--bfcl-tokens 1024] \
        [--batch N] [--micro-batch N] [--old-logps rollout|forward] [--threads N] [--seed N] \
        [--device cpu|cuda|auto]

Each kind builds the cycle's own GRPO trainer (``make_grpo_trainer``) and runs
``--steps`` optimisation steps. A generation round plays ``--prompts`` tasks x
``--generations`` episodes; an optimisation step takes ``--batch`` of them (default:
the whole round, so every step generates; the loop's quickstart takes 8 of a round
of 32, so one step in four generates), ``--micro-batch`` episodes per
forward/backward with gradient accumulation. Both kinds go through the multi-turn rollout
(``training/grpo/multiturn_rollout.py``): TRL's own tool loop cannot parse SmolLM2's
plain-call replies, so ``grpo.rollout: auto`` picks it for the world too. The
world's tasks are single-turn (train split); BFCL's are multi_turn_base
(train split), every user turn played. Prints, per kind, seconds per step
(TRL's ``step_time``: generation, reward and the update) and where it went: the
rollout (``rollout_func``: generation and the environment), TRL's no-grad
log-probability passes (old policy, reference) and the rest (the update's forward
and backward), the mean episode in
generated / environment tokens and user turns, the whole run's wall time and the
process's peak resident memory so far (Linux ``ru_maxrss``), and on a GPU the peak
of torch's allocations on it.

The model defaults to the converted SmolLM2 base (``training/bootstrap/smollm2.py``,
cached under ``$COEVOLVE_CACHE`` or ``~/.cache/coevolve``; the first conversion
takes 30-55 s and is not counted). Not run by the tests.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


# The bench's episode kinds: an environment of the registry and its category (the world
# has none and ignores it).
KINDS = {"world": ("world", "multi_turn_base"), "bfcl": ("bfcl", "multi_turn_base")}


def _tasks(kind: str, count: int) -> tuple[list, object]:
    from coevolve.envs.catalog import load_tasks
    from coevolve.envs.registry import get_environment

    if kind not in KINDS:
        raise SystemExit(f"unknown kind {kind!r}: {' or '.join(KINDS)}")
    name, category = KINDS[kind]
    tasks = load_tasks(name, split="train", category=category)
    return tasks[:count], get_environment(name).environment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model directory (default: SmolLM2 base)")
    parser.add_argument("--kinds", default="world,bfcl")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="training seed (default: the config's): other seeds draw other episodes",
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=2, help="tasks per generation round")
    parser.add_argument("--generations", type=int, default=4, help="episodes per task (G)")
    parser.add_argument("--world-tokens", type=int, default=384, help="episode token budget")
    parser.add_argument("--bfcl-tokens", type=int, default=1024, help="episode token budget")
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="episodes per optimisation step (default: the round, prompts x generations); "
        "must divide the round",
    )
    parser.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="episodes per forward/backward (grpo.micro_batch_size; default: the config's, 2); "
        "0: the whole round at once, as before that setting existed",
    )
    parser.add_argument(
        "--old-logps",
        choices=("rollout", "forward"),
        default="rollout",
        help="where a round that feeds several steps gets the old policy's log-probs: from the "
        "rollout that sampled the tokens (default), or TRL's no-grad forward pass (as before)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's). Two processes of 2 threads on 2 cores wait on "
        "each other at every op: give each 1 to run two side by side",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda", "auto"),
        default="cpu",
        help="where the policy trains and generates (training.device; auto: cuda when "
        "available). On cuda the trainer runs in bfloat16 where the card has it",
    )
    args = parser.parse_args()

    import resource

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from coevolve.agents.prompts import POLICY_SYSTEM_PROMPT
    from coevolve.common.tokenization import load_tokenizer
    from coevolve.training.config import TrainingConfig
    from coevolve.training.grpo.grpo_trainer import make_grpo_trainer
    from coevolve.training.grpo_config import GrpoConfig
    from coevolve.training.trainer_common import common_arguments, quiet_trainer, resolve_device

    if args.model is None:
        from coevolve.training.bootstrap.smollm2 import base_model_dir

        started = time.perf_counter()
        model_dir = base_model_dir(progress=True)
        print(f"SmolLM2 base ready in {time.perf_counter() - started:.1f} s: {model_dir}")
    else:
        model_dir = Path(args.model)
    print(
        f"model {model_dir.name}, {args.steps} steps of {args.prompts} tasks x "
        f"{args.generations} episodes, torch threads {torch.get_num_threads()}, "
        f"cpus {os.cpu_count()}, load {os.getloadavg()[0]:.1f}"
    )
    # --micro-batch 0: the whole round at once (grpo.micro_batch_size None)
    micro = {} if args.micro_batch is None else {"micro_batch_size": args.micro_batch or None}
    round_size = args.prompts * args.generations
    batch = args.batch or round_size
    if round_size % batch:
        raise SystemExit(f"--batch {batch} must divide the round of {round_size} episodes")
    for kind in args.kinds.split(","):
        tasks, make_env = _tasks(kind, args.prompts)
        budget = {"world": args.world_tokens, "bfcl": args.bfcl_tokens}[kind]
        config = TrainingConfig(
            algorithm="grpo",
            device=args.device,
            max_steps=args.steps,
            batch_size=batch,
            grpo=GrpoConfig(
                prompts_per_step=args.prompts,
                num_generations=args.generations,
                max_completion_length=budget,
            ).model_copy(update=micro),
            max_length=budget + 1024,
            **({} if args.seed is None else {"seed": args.seed}),
        )
        device = resolve_device(config)
        work = Path(tempfile.mkdtemp(prefix="coevolve-grpo-bench-"))
        tokenizer = load_tokenizer(model_dir)
        trainer, _, reason = make_grpo_trainer(
            config,
            model_dir=model_dir,
            previous_adapter=None,
            tokenizer=tokenizer,
            tasks=tasks,
            make_env=make_env,  # type: ignore[arg-type]
            system_prompt=POLICY_SYSTEM_PROMPT,
            arguments=common_arguments(config, device, work, progress=False),
        )
        if trainer is None:
            raise SystemExit(f"{kind}: {reason}")
        quiet_trainer(trainer, progress=False)
        trainer.old_logps_from_rollout = args.old_logps == "rollout"
        rollout_func = trainer.rollout_func
        phases = _time_phases(trainer)
        started = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - started
        logs = [entry for entry in trainer.state.log_history if "step_time" in entry]
        seconds = [entry["step_time"] for entry in logs]
        rest = sum(seconds) - phases["rollout"] - phases["no-grad log-probs"]
        episodes = rollout_func.last_episodes
        generated = sum(sum(e.env_mask) for e in episodes) / len(episodes)
        environment = sum(len(e.env_mask) - sum(e.env_mask) for e in episodes) / len(episodes)
        turns = [entry.get("multi_turn/user_turns", float("nan")) for entry in logs]
        rewards = ", ".join(f"{entry.get('reward', 0.0):.2f}" for entry in logs)
        print(
            f"{kind}: {type(trainer).__name__}, s/step {', '.join(f'{s:.1f}' for s in seconds)} "
            f"(mean {sum(seconds) / len(seconds):.1f}); last round's mean episode: "
            f"{generated:.0f} generated + {environment:.0f} environment tokens, "
            f"prompt {sum(len(e.prompt_ids) for e in episodes) / len(episodes):.0f}; "
            f"user turns per episode {', '.join(f'{t:.2f}' for t in turns)} "
            f"(tasks have {', '.join(str(len(t.turns)) for t in tasks)}); "
            f"reward {rewards}; "
            f"phases over all steps: rollout {phases['rollout']:.1f} s, no-grad log-probs "
            f"{phases['no-grad log-probs']:.1f} s ({phases['no-grad passes']:.0f} batches), "
            f"update and the rest {rest:.1f} s; "
            f"wall {wall:.1f} s, load {os.getloadavg()[0]:.1f}, peak resident "
            f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GB so far"
            + (
                f", peak on the GPU {torch.cuda.max_memory_allocated() / 2**30:.2f} GB so far"
                if device == "cuda"
                else ""
            ),
            flush=True,
        )


def _time_phases(trainer: object) -> dict[str, float]:
    """Seconds spent in the rollout and in TRL's no-grad log-probability passes, summed
    over the run (the trainer's own methods, wrapped on this instance)."""
    import torch

    phases = {"rollout": 0.0, "no-grad log-probs": 0.0, "no-grad passes": 0.0}
    rollout = trainer.rollout_func  # type: ignore[attr-defined]
    logps = trainer._get_per_token_logps_and_entropies  # type: ignore[attr-defined]

    class TimedRollout:
        """The rollout, timed; its attributes (``last_episodes``, which the trainer reads
        for the old policy's log-probs) pass through."""

        def __call__(self, *args: object, **kwargs: object) -> object:
            started = time.perf_counter()
            try:
                return rollout(*args, **kwargs)
            finally:
                phases["rollout"] += time.perf_counter() - started

        def __getattr__(self, name: str) -> object:
            return getattr(rollout, name)

    def timed_logps(*args: object, **kwargs: object) -> object:
        if torch.is_grad_enabled():
            return logps(*args, **kwargs)
        started = time.perf_counter()
        try:
            return logps(*args, **kwargs)
        finally:
            phases["no-grad log-probs"] += time.perf_counter() - started
            phases["no-grad passes"] += 1

    trainer.rollout_func = TimedRollout()  # type: ignore[attr-defined]
    trainer._get_per_token_logps_and_entropies = timed_logps  # type: ignore[attr-defined]
    return phases


if __name__ == "__main__":
    main()
