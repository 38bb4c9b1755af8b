"""Configuration: pydantic models loaded from YAML, with errors a person can act on.

Every field carries help text (``description``); unknown keys are errors, and an
error names the key's full path, the allowed keys or values, and a likely
intended spelling. ``coevolve config show`` prints the defaults.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .agents.prompts import POLICY_SYSTEM_PROMPT
from .agents.roles import RolesConfig
from .envs.bfcl import CATEGORIES as BFCL_CATEGORIES
from .envs.bfcl import SPLITS as BFCL_SPLITS
from .envs.world.families import SPLITS as WORLD_SPLITS
from .memory.pool import PoolConfig
from .memory.signals import SignalConfig
from .tracking import TrackingConfig
from .training.bootstrap import BootstrapConfig
from .training.config import TrainingConfig
from .training.hard_negatives import HardNegativeSettings

# Characters per token of an endpoint's default reply limit (EndpointConfig.reply_limit).
CHARS_PER_TOKEN = 16


class ConfigError(ValueError):
    """A configuration that cannot be used; the message says what to change."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EndpointConfig(Section):
    """An OpenAI-compatible chat-completions endpoint (vLLM, a hosted API, a test server)."""

    base_url: str = Field(description="Server URL including /v1, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field(
        description="Model name the server knows; with vLLM a LoRA adapter name works too."
    )
    api_key_env: str | None = Field(
        default=None,
        description="Name of the environment variable holding the API key (None: no key).",
    )
    temperature: float = Field(default=0.7, ge=0.0, le=2.0, description="Sampling temperature.")
    max_tokens: int = Field(default=512, gt=0, description="Most tokens per reply.")
    timeout_s: float = Field(
        default=60.0, gt=0, description="Seconds before one request is abandoned."
    )
    max_retries: int = Field(
        default=3, ge=0, description="Retries after a 5xx, timeout or dropped connection."
    )
    concurrency: int = Field(default=16, gt=0, description="Most requests in flight at once.")
    max_reply_chars: int | None = Field(
        default=None,
        gt=0,
        description="Longest reply (text plus tool-call arguments, in characters) that is read; "
        f"a longer one is rejected unparsed as 'reply too long'. None: {CHARS_PER_TOKEN} × "
        "max_tokens, far above real text (3-5 characters a token), so only a server that "
        "ignores max_tokens (a proxy, a misconfigured or hostile server) reaches it.",
    )

    def reply_limit(self) -> int:
        """The longest reply, in characters, that a role reads from this endpoint."""
        return self.max_reply_chars or CHARS_PER_TOKEN * self.max_tokens

    def api_key(self) -> str:
        if self.api_key_env is None:
            return "EMPTY"
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(
                f"endpoint {self.base_url}: environment variable {self.api_key_env} is not set"
            )
        return key


class EnvConfig(Section):
    """Which environment to run, and which of its task sets."""

    name: Literal["world", "bfcl"] = Field(
        default="world", description="Environment: the built-in world or BFCL."
    )
    split: str = Field(
        default="train",
        description=f"Task split the loop rolls out and trains on: world {', '.join(WORLD_SPLITS)}; "
        f"BFCL {', '.join(BFCL_SPLITS)} (half of the category each, or all of it).",
    )
    category: str = Field(
        default="multi_turn_base", description=f"BFCL category: {', '.join(BFCL_CATEGORIES)}."
    )
    seed: int = Field(default=0, description="Seed of the world's task generator.")

    @model_validator(mode="after")
    def _known_task_set(self) -> EnvConfig:
        if self.name == "world" and self.split not in WORLD_SPLITS:
            raise ValueError(
                f"split {self.split!r} is not a world split; allowed values: {', '.join(WORLD_SPLITS)}"
            )
        if self.name == "bfcl" and self.category not in BFCL_CATEGORIES:
            raise ValueError(
                f"category {self.category!r} is not a BFCL category; allowed values: {', '.join(BFCL_CATEGORIES)}"
            )
        if self.name == "bfcl" and self.split not in BFCL_SPLITS:
            raise ValueError(
                f"split {self.split!r} is not a BFCL split; allowed values: {', '.join(BFCL_SPLITS)}"
            )
        return self


class PolicyConfig(Section):
    """The agent being trained: an in-process model or an OpenAI-compatible endpoint."""

    kind: Literal["local", "endpoint"] = Field(
        default="local",
        description="local: a transformers model in this process; endpoint: a server.",
    )
    model: str = Field(
        default="bootstrap",
        description="local: 'bootstrap' (the cached bootstrap model, built if missing) or a model directory.",
    )
    adapter: str | None = Field(
        default=None, description="local: a peft LoRA adapter directory to apply."
    )
    device: str = Field(default="cpu", description="local: torch device, e.g. cpu or cuda.")
    max_new_tokens: int = Field(
        default=96, gt=0, description="local: most tokens generated per message."
    )
    batch_size: int = Field(
        default=64, gt=0, description="local: most conversations in one generate call."
    )
    endpoint: str | EndpointConfig | None = Field(
        default=None,
        description="endpoint: the name of an entry in `endpoints`, or an inline endpoint.",
    )
    system_prompt: str = Field(
        default=POLICY_SYSTEM_PROMPT, description="System message of every episode."
    )
    train_model: str | None = Field(
        default=None,
        description="endpoint: the local copy of the served base model (a directory) that "
        "`coevolve run` trains LoRA adapters on; the server must read the adapters' paths.",
    )

    @model_validator(mode="after")
    def _endpoint_matches_kind(self) -> PolicyConfig:
        if self.kind == "endpoint" and self.endpoint is None:
            raise ValueError(
                "kind 'endpoint' needs `endpoint:` (a name from `endpoints` or base_url + model)"
            )
        if self.kind == "local" and self.endpoint is not None:
            raise ValueError(
                "`endpoint` is only used with kind: endpoint; remove it or set kind: endpoint"
            )
        return self


class RolloutConfig(Section):
    """How episodes are sampled."""

    k: int = Field(default=8, gt=0, description="Rollouts per task per cycle (K).")
    temperature: float = Field(
        default=0.9, ge=0.0, le=2.0, description="Sampling temperature of rollouts."
    )
    eval_temperature: float = Field(
        default=0.0, ge=0.0, le=2.0, description="Temperature for evaluation (0: greedy)."
    )
    max_steps: int = Field(
        default=12,
        gt=0,
        description="Most steps (assistant messages with tool calls) per user turn before the "
        "episode is cut off.",
    )


class SynthesisConfig(Section):
    """The synthesis pass: its roles, the task store and dedup."""

    roles: RolesConfig = Field(
        default_factory=RolesConfig, description="Which implementation each role uses."
    )
    store_path: str | None = Field(
        default=None, description="Chroma store directory (None: <run_dir>/task_store)."
    )
    store_url: str | None = Field(
        default=None,
        description="A Chroma server (http://host:port) instead of the embedded store.",
    )
    dedup_threshold: float = Field(
        default=0.8, gt=0.0, le=1.0, description="Cosine similarity at which a task is a duplicate."
    )
    neighbours: int = Field(
        default=5, ge=0, description="Nearest stored tasks shown to the abstractor."
    )
    max_concurrency: int = Field(default=16, gt=0, description="Flagged items synthesized at once.")
    enabled: bool = Field(
        default=True,
        description="False: no synthesis; the pool stays the seed tasks (the 'static' arm of "
        "the learning ablation).",
    )
    max_accepted: int | None = Field(
        default=None,
        gt=0,
        description="Most synthesized tasks a cycle accepts (None: every novel one); the "
        "learning ablation fixes it so that every arm gets the same amount of new data.",
    )
    dedup_against: Literal["all", "synthesized"] = Field(
        default="all",
        description="Which stored tasks a candidate is compared with for dedup (the batch "
        "always counts): all (the paper's rule), or synthesized tasks only. Structure-keeping "
        "variants share their family's wording and tool line with the seed tasks (0.8-1.0 "
        "similarity to the nearest of 1000 seeds, docs/benchmarks.md), so against the seeds "
        "most of them read as duplicates.",
    )
    judge_veto: bool = Field(
        default=True,
        description="True: a candidate is accepted only if its replay verifies and the judge "
        "agrees (an LLM judge's no rejects it). False: the paper's rule, judged successful OR "
        "rewarded by the environment.",
    )


class EvaluationConfig(Section):
    """The held-out measurement after every cycle (and before the first)."""

    split: str = Field(
        default="heldout",
        description=f"Split evaluated each cycle: world {', '.join(WORLD_SPLITS)}; BFCL "
        "heldout (the half of env.category the loop never trains on). Synthesis never "
        "sees it, and it may not be the split the loop trains on (env.split).",
    )
    per_family: int | None = Field(
        default=None,
        gt=0,
        description="Evaluate the first N tasks of every family (None: the whole split).",
    )

    @model_validator(mode="after")
    def _known_split(self) -> EvaluationConfig:
        known = dict.fromkeys([*WORLD_SPLITS, *BFCL_SPLITS])
        if self.split not in known:
            raise ValueError(
                f"split {self.split!r} is not a task split; allowed values: {', '.join(known)}"
            )
        return self


class CoevolveConfig(Section):
    """Everything a run needs."""

    run_dir: str = Field(
        default="runs/default", description="Where the run writes checkpoints, adapters, reports."
    )
    cycles: int = Field(default=3, gt=0, description="Training cycles the run makes.")
    seed: int = Field(
        default=0, description="Seed of rollout sampling, synthesis and training in every cycle."
    )
    env: EnvConfig = Field(default_factory=EnvConfig, description="The environment and task set.")
    policy: PolicyConfig = Field(
        default_factory=PolicyConfig, description="The agent being trained."
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Episode sampling.")
    bootstrap: BootstrapConfig = Field(
        default_factory=BootstrapConfig,
        description="The bootstrap small model (policy.model: bootstrap).",
    )
    signals: SignalConfig = Field(
        default_factory=SignalConfig, description="Failure-prone trajectory detectors."
    )
    synthesis: SynthesisConfig = Field(
        default_factory=SynthesisConfig, description="Task synthesis and dedup."
    )
    pool: PoolConfig = Field(
        default_factory=PoolConfig, description="The training pool and how cycles sample it."
    )
    training: TrainingConfig = Field(
        default_factory=TrainingConfig, description="The TRL + LoRA step of every cycle."
    )
    evaluation: EvaluationConfig = Field(
        default_factory=EvaluationConfig, description="Held-out evaluation each cycle."
    )
    hard_negatives: HardNegativeSettings = Field(
        default_factory=HardNegativeSettings,
        description="Co-Evolving Agents: failure agent and DPO + SFT target (off by default).",
    )
    endpoints: dict[str, EndpointConfig] = Field(
        default_factory=dict,
        description="Named OpenAI-compatible endpoints; roles refer to them by name.",
    )
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig,
        description="Experiment tracking (TensorBoard, Trackio, W&B, MLflow) of training and "
        "of the loop's figures per cycle.",
    )

    @model_validator(mode="after")
    def _endpoint_names_exist(self) -> CoevolveConfig:
        known = ", ".join(self.endpoints) or "none defined"
        name = self.policy.endpoint
        if isinstance(name, str) and name not in self.endpoints:
            raise ValueError(f"policy.endpoint {name!r} is not in `endpoints` (defined: {known})")
        roles = self.synthesis.roles
        for role in ("default_endpoint", "summarizer", "explorer", "abstractor", "judge"):
            ref = getattr(roles, role)
            if ref is not None and ref != "offline" and ref not in self.endpoints:
                raise ValueError(
                    f"synthesis.roles.{role} {ref!r} is not in `endpoints` (defined: {known}); "
                    "name an endpoint or use 'offline'"
                )
        return self

    @model_validator(mode="after")
    def _never_evaluate_on_training_tasks(self) -> CoevolveConfig:
        trained, evaluated = self.env.split, self.evaluation.split
        if self.env.name == "world" and evaluated not in WORLD_SPLITS:
            raise ValueError(
                f"evaluation.split {evaluated!r} is not a world split; allowed values: "
                f"{', '.join(WORLD_SPLITS)}"
            )
        if self.env.name == "bfcl" and evaluated != "heldout":
            raise ValueError(
                f"evaluation.split {evaluated!r}: BFCL evaluates its heldout half "
                "(env.split: train trains on the other)"
            )
        if evaluated == trained or "all" in (trained, evaluated):
            raise ValueError(
                f"evaluation.split {evaluated!r} overlaps env.split {trained!r}, the tasks the "
                "loop trains on: train on one split and evaluate on another (env.split: train, "
                "evaluation.split: heldout)"
            )
        return self

    @model_validator(mode="after")
    def _oracle_has_validation(self) -> CoevolveConfig:
        if self.signals.selection == "oracle":
            if self.env.name != "world":
                raise ValueError(
                    "signals.selection 'oracle' reads the world's validation split; "
                    f"env {self.env.name!r} has none (use selection 'signals' or 'random')"
                )
            if self.evaluation.split == "validation":
                raise ValueError(
                    "signals.selection 'oracle' reads the validation split, so evaluating on it "
                    "would report a tuned figure: set evaluation.split to heldout"
                )
        return self

    def store_path(self) -> str:
        return self.synthesis.store_path or str(Path(self.run_dir) / "task_store")

    def endpoint(self, ref: str | EndpointConfig) -> EndpointConfig:
        """Resolve an endpoint reference (a name or an inline endpoint)."""
        return self.endpoints[ref] if isinstance(ref, str) else ref


def load_config(
    source: str | Path | dict[str, Any] | None = None, overrides: Sequence[str] = ()
) -> CoevolveConfig:
    """Load a config from a YAML file (or a dict); None gives the defaults.

    ``overrides`` are ``key.path=value`` settings (``--set`` on the command line)
    applied on top, in order; see ``apply_overrides``.
    """
    if source is None:
        data: Any = {}
        origin = "defaults"
    elif isinstance(source, dict):
        data, origin = source, "config"
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path} is not valid YAML: {err}") from None
        origin = str(path)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{origin}: the top level must be a mapping of keys, got {type(data).__name__}"
        )
    if overrides:
        data = apply_overrides(data, overrides)
        origin += " with " + " ".join(f"--set {item}" for item in overrides)
    try:
        return CoevolveConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{origin}: " + "; ".join(_explain(e) for e in err.errors())) from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"training.max_steps=10"`` -> (["training", "max_steps"], 10).

    The value is read as YAML (``10``, ``0.5``, ``true``, ``null``, ``[tensorboard]``,
    ``{a: 1}``, or a plain string); the config schema then types it.
    """
    key, sep, value = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(part.strip() for part in parts):
        raise ConfigError(
            f"--set {text!r}: expected KEY=VALUE with a dotted key, e.g. --set training.max_steps=10"
        )
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError as err:
        problem = str(err).splitlines()[0]
        raise ConfigError(
            f"--set {text!r}: the value is not valid YAML ({problem}); quote it, "
            "e.g. --set 'run_dir=\"runs/a b\"'"
        ) from None
    return [part.strip() for part in parts], parsed


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``data`` with each ``key.path=value`` set; an unknown key is a ConfigError
    naming the allowed keys and a likely spelling, as in YAML."""
    import copy

    result = copy.deepcopy(data)
    for text in overrides:
        parts, value = parse_override(text)
        _check_key_path(parts, text)
        target = result
        for depth, part in enumerate(parts[:-1]):
            child = target.get(part)
            if not isinstance(child, dict):
                if child is not None and not isinstance(child, dict):
                    where = ".".join(parts[: depth + 1])
                    raise ConfigError(
                        f"--set {text}: {where} is {child!r}, not a section; set {where} itself "
                        "or write the section in the YAML"
                    )
                child = {}
                target[part] = child
            target = child
        target[parts[-1]] = value
    return result


def _check_key_path(parts: list[str], text: str) -> None:
    """Walk the config models along ``parts``; an unknown key raises ConfigError with a hint."""
    model: type[BaseModel] | None = CoevolveConfig
    depth = 0
    while depth < len(parts):
        if model is None:
            parent = ".".join(parts[:depth])
            raise ConfigError(f"--set {text}: {parent} is a value, not a section; set {parent}=...")
        part = parts[depth]
        field = model.model_fields.get(part)
        if field is None:
            allowed = list(model.model_fields)
            hint = difflib.get_close_matches(part, allowed, n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            where = ".".join(parts[: depth + 1])
            raise ConfigError(
                f"--set {text}: unknown key {where!r}{suggestion}; allowed keys: {', '.join(allowed)}"
            )
        model, keyed = _section_of(field.annotation)
        depth += 2 if keyed else 1  # a dict of sections (endpoints): any entry name is allowed


def _section_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the config model a field holds, whether it is a dict of them by name)."""
    import types
    import typing

    origin = typing.get_origin(annotation)
    if origin is dict:
        _key, value = typing.get_args(annotation)
        section, _ = _section_of(value)
        return section, section is not None
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            section, keyed = _section_of(arg)
            if section is not None:
                return section, keyed
        return None, False
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def _explain(error: Any) -> str:
    loc = [str(part) for part in error["loc"]]
    where = ".".join(loc) or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = list(parent.model_fields) if parent else []
        hint = difflib.get_close_matches(loc[-1], allowed, n=1)
        suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
        return f"unknown key {where!r}{suggestion}; allowed keys: {', '.join(allowed)}"
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        return f"{where}: {error['input']!r} is not allowed; allowed values: {expected}"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if loc else message


def _model_at(loc: list[str]) -> type[BaseModel] | None:
    """The config model that a (valid) key path leads to, for listing its keys."""
    model: type[BaseModel] = CoevolveConfig
    for part in loc:
        field = model.model_fields.get(part)
        if field is None:
            continue  # a dict key (an endpoint's name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        elif part in ("endpoints", "endpoint"):
            model = EndpointConfig
    return model
