"""What the time limit on a tool call costs (envs/limits.py): each call of a reference
solution through ``env.step`` with the limit (the call in a daemon thread, waited for) and
without it (the call made in the caller's thread), on the built-in world's tools and on the
support desk's (examples/support_desk). Prints microseconds per call and their ratio.

    python bench/tool_call_overhead.py [--tasks 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from coevolve.envs import base
from coevolve.envs.registry import get_environment
from coevolve.records import Task

EXAMPLE = "examples.support_desk.env:make_env"


def _direct(tool: str, call: Callable[[], Any], timeout_s: float) -> Any:
    """The call made in the caller's thread: no limit (the baseline)."""
    return call()


def seconds_per_call(make_env: Callable[[], Any], tasks: Sequence[Task], limited: bool) -> float:
    """Seconds per reference call through ``env.step``, with or without the time limit."""
    real = base.call_with_time_limit
    base.call_with_time_limit = real if limited else _direct
    try:
        envs = [(make_env(), task) for task in tasks]
        calls = 0
        started = time.perf_counter()
        for env, task in envs:
            env.reset(task)
            for call in task.reference_calls:
                env.step(call)
                calls += 1
        return (time.perf_counter() - started) / max(calls, 1)
    finally:
        base.call_with_time_limit = real


def measure(name: str, tasks: int, repeats: int) -> dict[str, float]:
    spec = get_environment(name)
    task_set = spec.load_task_set("train")[:tasks]
    seconds_per_call(spec.environment, task_set, limited=True)  # warm up
    direct = [seconds_per_call(spec.environment, task_set, False) for _ in range(repeats)]
    limited = [seconds_per_call(spec.environment, task_set, True) for _ in range(repeats)]
    direct_us, limited_us = 1e6 * statistics.median(direct), 1e6 * statistics.median(limited)
    return {
        "calls": sum(len(task.reference_calls) for task in task_set),
        "direct_us": direct_us,
        "limited_us": limited_us,
        "overhead_us": limited_us - direct_us,
        "ratio": limited_us / direct_us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200, help="Train tasks per environment.")
    parser.add_argument("--repeats", type=int, default=5, help="Timed passes; the median.")
    args = parser.parse_args()
    print(f"{'environment':<14} {'calls':>6} {'direct µs':>10} {'limited µs':>11} "
          f"{'overhead µs':>12} {'ratio':>6}")  # fmt: skip
    for label, name in (("world", "world"), ("support desk", EXAMPLE)):
        row = measure(name, args.tasks, args.repeats)
        print(
            f"{label:<14} {row['calls']:>6} {row['direct_us']:>10.1f} {row['limited_us']:>11.1f} "
            f"{row['overhead_us']:>12.1f} {row['ratio']:>6.2f}"
        )


if __name__ == "__main__":
    main()
