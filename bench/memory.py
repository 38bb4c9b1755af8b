"""Peak resident memory of each stage of one quickstart-shaped cycle.

    .venv/bin/python bench/memory.py                    # configs/quickstart.yaml, SmolLM2
    .venv/bin/python bench/memory.py --quick            # the tiny test model: seconds
    .venv/bin/python bench/memory.py --allocators evaluate   # + where that stage allocates
    .venv/bin/python bench/memory.py --config my.yaml --threads 2
    .venv/bin/python bench/memory.py --evaluate-only --set policy.batch_size=32

Runs the stages of one cycle as the loop does (``coevolve.graph.cycle.stages``): bootstrap
(the agent built when it is not cached), load (the policy), rollout, signals,
synthesis, pool, train, evaluate (``--evaluate-only``: bootstrap, load and the
cycle-0 evaluation, the stage that held ``make demo``'s peak). For each it prints
the seconds, the peak resident memory of this process during the stage (Linux: the kernel's
high-water mark ``VmHWM``, reset before each stage through
``/proc/self/clear_refs``; elsewhere a sampler thread), the peak of the processes
it launched (``training.launcher: subprocess`` or ``accelerate``: their resident
memory summed, sampled every 50 ms), the
resident memory left when the stage ended, and the in-process policy's KV
figures: the largest total of keys and values kept between steps and the largest
padded batch of them built for one forward pass (``agents/policy/kv_reuse.py``).

``--allocators STAGE[,STAGE]`` runs those stages under torch's profiler with
``profile_memory`` and prints the ten operators that allocated the most tensor
memory (net of what they freed); it slows the stage, and generation then runs in
the event loop's thread (the profiler records the thread it started in).

The run directory is a temporary one (``--keep DIR`` keeps it there instead);
the bootstrap agent comes from the usual cache (``$COEVOLVE_CACHE`` or
``~/.cache/coevolve``), ``--quick`` builds the tiny one in a temporary cache.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

REPO = Path(__file__).resolve().parent.parent
GIB = 1024**3
STAGES = ("bootstrap", "load", "rollout", "signals", "synthesis", "pool", "train", "evaluate")


def _status_kib(field: str) -> int | None:
    """A ``VmXXX`` figure of /proc/self/status in KiB (None off Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_high_water_mark() -> bool:
    """Set this process's peak resident memory (VmHWM) back to its current resident
    memory, so the next stage's peak is its own (Linux 4.0 and later)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def _children_rss() -> int:
    """Bytes resident in every process this one started, and theirs."""
    import psutil

    total = 0
    for child in psutil.Process().children(recursive=True):
        try:
            total += child.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def _own_rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


@dataclass
class StageMemory:
    name: str
    seconds: float = 0.0
    peak: int = 0  # bytes resident in this process at the stage's highest point
    children_peak: int = 0  # bytes resident in its launched processes, summed
    end: int = 0  # bytes resident when the stage ended
    kv_kept_peak: int = 0  # keys and values kept between generation steps
    kv_batch_peak: int = 0  # the largest padded batch of keys and values of one forward
    note: str = ""


class PeakMeter:
    """Measures one stage: the kernel's high-water mark where it can be reset, and a
    sampler thread for the launched processes (and for this one elsewhere)."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sampled_peak = 0
        self.children_peak = 0
        self.exact = False

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.children_peak = max(self.children_peak, _children_rss())
            if not self.exact:
                self.sampled_peak = max(self.sampled_peak, _own_rss())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakMeter:
        gc.collect()
        self.exact = _reset_high_water_mark()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()

    def peak(self) -> int:
        if self.exact:
            return (_status_kib("VmHWM") or 0) * 1024
        return max(self.sampled_peak, _own_rss())

    def children(self) -> int:
        # Sampled only: RUSAGE_CHILDREN also counts a short-lived fork (ctypes.util,
        # subprocess helpers) as resident with all of this process's pages.
        return self.children_peak


@contextmanager
def profiled(enabled: bool, rows: int = 10) -> Iterator[None]:
    """Torch's profiler around the block; prints the call sites that allocated most."""
    if not enabled:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield
    table = prof.key_averages().table(
        sort_by="self_cpu_memory_usage", row_limit=rows, max_name_column_width=40
    )
    print("  largest allocators (torch profiler: tensor memory per operator, net of its frees):")
    for line in table.splitlines():
        print("   ", line)


def _gib(value: int) -> str:
    return f"{value / GIB:.2f}" if value else "-"


def _mib(value: int) -> str:
    return f"{value / 2**20:.0f}" if value else "-"


def print_table(rows: list[StageMemory]) -> None:
    print()
    print(
        f"{'stage':<10} {'seconds':>8} {'peak GiB':>9} {'launched':>9} {'end GiB':>8} "
        f"{'KV kept MiB':>12} {'KV batch MiB':>13}  note"
    )
    for row in rows:
        print(
            f"{row.name:<10} {row.seconds:>8.1f} {_gib(row.peak):>9} {_gib(row.children_peak):>9} "
            f"{_gib(row.end):>8} {_mib(row.kv_kept_peak):>12} {_mib(row.kv_batch_peak):>13}  "
            f"{row.note}"
        )
    overall = max((max(row.peak, row.children_peak) for row in rows), default=0)
    print(f"highest peak of any stage: {_gib(overall)} GiB")


def one_cycle(
    values: dict[str, Any], run_dir: Path, launcher: str | None, overrides: list[str]
) -> Any:
    from coevolve.config import apply_overrides, load_config

    values = {**values, "run_dir": str(run_dir), "cycles": 1}
    if launcher is not None:
        values["training"] = {**values["training"], "launcher": launcher}
    return load_config(apply_overrides(values, overrides))


def quick_config(run_dir: Path, launcher: str | None, overrides: list[str]) -> Any:
    """The quickstart with the learning bench's quick sections: the tiny model, a few
    tasks, one training step."""
    from coevolve.config import load_config
    from coevolve.training.tiny_presets import quick_bench

    base = load_config(REPO / "configs" / "quickstart.yaml")
    values = {**base.model_dump(mode="json"), **quick_bench()}
    return one_cycle(values, run_dir, launcher, overrides)


def full_config(path: Path, run_dir: Path, launcher: str | None, overrides: list[str]) -> Any:
    from coevolve.config import load_config

    return one_cycle(load_config(path).model_dump(mode="json"), run_dir, launcher, overrides)


async def run_cycle(
    config: Any, allocators: set[str], threads: int | None, evaluate_only: bool = False
) -> list[StageMemory]:
    from coevolve import build_bootstrap_agent, build_runtime
    from coevolve.graph.cycle import stages

    rows: list[StageMemory] = []
    policy_cache: Any = None

    async def measure(name: str, work: Callable[[], Any]) -> Any:
        row = StageMemory(name)
        cache = policy_cache
        if cache is not None:
            cache.reset_peaks()
        started = time.perf_counter()
        with PeakMeter() as meter, profiled(name in allocators):
            result = work()
            if asyncio.iscoroutine(result):
                result = await result
        row.seconds = time.perf_counter() - started
        row.peak, row.children_peak, row.end = meter.peak(), meter.children(), _own_rss()
        if cache is not None:
            row.kv_kept_peak, row.kv_batch_peak = cache.peak_kept_bytes, cache.peak_batch_bytes
        rows.append(row)
        print(
            f"{name}: {row.seconds:.1f} s, peak {_gib(row.peak)} GiB"
            f" (launched processes {_gib(row.children_peak)} GiB), {_gib(row.end)} GiB at the end",
            flush=True,
        )
        return result

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    cycle = 1
    # Building a runtime never trains: a missing bootstrap agent is its own step.
    await measure("bootstrap", lambda: build_bootstrap_agent(config, progress=False))
    runtime = await measure("load", lambda: build_runtime(config, progress=False))
    policy = runtime.policy
    generate_sync = getattr(policy, "generate_sync", None)
    if allocators and generate_sync is not None:
        # Torch's profiler records the thread it started in; the policy generates in a
        # worker thread (asyncio.to_thread) unless it is told to answer here.
        async def generate_here(
            conversations: Any, tools: Any = None, temperature: Any = None, **_: Any
        ) -> Any:
            return generate_sync(conversations, tools, temperature)

        policy.generate = generate_here
    policy_cache = getattr(policy, "prefix_cache", None)
    if policy_cache is not None and not hasattr(policy_cache, "reset_peaks"):
        policy_cache = None  # a policy from before the KV figures were counted
    if evaluate_only:
        # The loop's cycle-0 evaluation: the agent before any training.
        _, evaluation = await measure("evaluate", lambda: stages.evaluate(runtime, 0))
        successes = round(evaluation.success * evaluation.episodes)
        rows[-1].note = f"success {successes}/{evaluation.episodes}"
        return rows
    trajectories, rollout_figures = await measure("rollout", lambda: stages.rollout(runtime, cycle))
    rows[-1].note = f"{rollout_figures.episodes} episodes"
    flagged, _ = await measure("signals", lambda: stages.signals(runtime, cycle, trajectories))
    rows[-1].note = f"{len(flagged)} flagged"
    synthesized, _ = await measure("synthesis", lambda: stages.synthesize(runtime, cycle, flagged))
    rows[-1].note = f"{len(synthesized.accepted)} accepted"
    sample, _ = await measure(
        "pool", lambda: stages.update_pool(runtime, cycle, synthesized.accepted)
    )
    trained, _ = await measure(
        "train", lambda: stages.train(runtime, cycle, trajectories, flagged, sample, None)
    )
    launcher = config.training.launcher
    rows[-1].note = f"{trained.steps} steps, launcher {launcher}"
    _, evaluation = await measure("evaluate", lambda: stages.evaluate(runtime, cycle))
    successes = round(evaluation.success * evaluation.episodes)
    rows[-1].note = f"success {successes}/{evaluation.episodes}"
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny test model, a few tasks")
    parser.add_argument(
        "--config", type=Path, default=REPO / "configs" / "quickstart.yaml", help="run config"
    )
    parser.add_argument(
        "--allocators", default="", help="stages to profile, comma-separated (e.g. evaluate)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument(
        "--launcher",
        choices=("inprocess", "subprocess", "accelerate"),
        default=None,
        help="where the training step runs (default: the config's training.launcher)",
    )
    parser.add_argument("--keep", type=Path, default=None, help="run directory to keep")
    parser.add_argument(
        "--evaluate-only",
        action="store_true",
        help="only bootstrap, load and the cycle-0 evaluation (make demo's highest stage)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, as `coevolve run --set` (e.g. policy.batch_size=32)",
    )
    args = parser.parse_args(argv)
    allocators = {name for name in args.allocators.split(",") if name}
    unknown = allocators - set(STAGES)
    if unknown:
        parser.error(f"--allocators: no stage {', '.join(sorted(unknown))}; stages: {STAGES}")

    with tempfile.TemporaryDirectory(prefix="coevolve-memory-") as scratch:
        run_dir = args.keep or Path(scratch) / "run"
        if args.quick:
            # The tiny model goes into $COEVOLVE_CACHE when it is set (the tests' cache),
            # else into a temporary one: it is built in seconds.
            os.environ.setdefault("COEVOLVE_CACHE", str(Path(scratch) / "cache"))
            config = quick_config(run_dir, args.launcher, args.overrides)
        else:
            config = full_config(args.config, run_dir, args.launcher, args.overrides)
        print(
            f"memory bench: {'quick (tiny model)' if args.quick else args.config}, "
            f"one cycle in {run_dir}",
            flush=True,
        )
        rows = asyncio.run(run_cycle(config, allocators, args.threads, args.evaluate_only))
    print_table(rows)


if __name__ == "__main__":
    main()
