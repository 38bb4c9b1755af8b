"""Configuration: the composition of the config sections, loaded from YAML, with errors a
person can act on.

Each section lives beside the code it configures (``envs/config.py``,
``agents/config.py``, ``graph/synthesis/config.py``, ``memory/signals.py``,
``memory/pool.py``, ``training/config.py``, ...); this module only composes them
into ``CoevolveConfig``, checks what spans sections, loads YAML, applies ``--set``
overrides and explains errors, and nothing below it imports it. The section
models are re-exported here, since users and docs name them as ``coevolve.config``.

Every field carries help text (``description``); unknown keys are errors, and an
error names the key's full path, the allowed keys or values, and a likely
intended spelling. ``coevolve config show`` prints the defaults.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from .agents.config import (
    CHARS_PER_TOKEN,
    EndpointConfig,
    EvaluationConfig,
    PolicyConfig,
    RolloutConfig,
)
from .agents.roles.role_interfaces import ENDPOINT_ROLES, OFFLINE
from .common.config_base import ConfigError, Section
from .envs.config import EnvConfig
from .envs.registry import ENVIRONMENTS, get_environment
from .envs.user_env import find_user_environment
from .graph.synthesis.config import SynthesisConfig
from .memory.pool import PoolConfig
from .memory.signals import SignalConfig
from .outputs.tracking import TrackingConfig
from .run_files import RunFiles
from .training.bootstrap.bootstrap_config import BOOTSTRAP_ENVIRONMENT, BootstrapConfig
from .training.config import TrainingConfig
from .training.hard_negatives.settings import HardNegativeConfig

__all__ = [
    "CHARS_PER_TOKEN",
    "CoevolveConfig",
    "ConfigError",
    "EndpointConfig",
    "EnvConfig",
    "EvaluationConfig",
    "PolicyConfig",
    "RolloutConfig",
    "Section",
    "SynthesisConfig",
    "apply_overrides",
    "load_config",
    "parse_override",
]


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
    hard_negatives: HardNegativeConfig = Field(
        default_factory=HardNegativeConfig,
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

    def endpoint_references(self) -> dict[str, str]:
        """Each field that names one of ``endpoints``, with the name it gives (a role set to
        'offline', or an endpoint given inline, names none)."""
        roles = self.synthesis.roles
        named = {
            "policy.endpoint": self.policy.endpoint,
            "synthesis.embedding_endpoint": self.synthesis.embedding_endpoint,
        }
        named |= {
            f"synthesis.roles.{role}": getattr(roles, role)
            for role in ENDPOINT_ROLES
            if getattr(roles, role) != OFFLINE
        }
        return {field: name for field, name in named.items() if isinstance(name, str)}

    @model_validator(mode="after")
    def _endpoint_names_exist(self) -> CoevolveConfig:
        known = ", ".join(self.endpoints) or "none defined"
        for field, name in self.endpoint_references().items():
            if name in self.endpoints:
                continue
            if field == "synthesis.embedding_endpoint":
                hint = "; name an endpoint, give base_url + model, or remove it for the local embedding"
            elif field.startswith("synthesis.roles."):
                hint = "; name an endpoint or use 'offline'"
            else:
                hint = ""
            raise ValueError(f"{field} {name!r} is not in `endpoints` (defined: {known}){hint}")
        return self

    @model_validator(mode="after")
    def _never_evaluate_on_training_tasks(self) -> CoevolveConfig:
        trained, evaluated = self.env.split, self.evaluation.split
        spec = get_environment(self.env.name)
        if evaluated not in spec.evaluation_splits:
            note = f" ({spec.evaluation_note})" if spec.evaluation_note else ""
            raise ValueError(
                f"evaluation.split {evaluated!r} is not a {spec.title} evaluation split; "
                f"allowed values: {', '.join(spec.evaluation_splits)}{note}"
            )
        if evaluated == trained or "all" in (trained, evaluated):
            raise ValueError(
                f"evaluation.split {evaluated!r} overlaps env.split {trained!r}, the tasks the "
                "loop trains on: train on one split and evaluate on another (env.split: train, "
                "evaluation.split: heldout)"
            )
        return self

    @model_validator(mode="after")
    def _task_sets_hold_tasks(self) -> CoevolveConfig:
        # A user's task file may leave a split empty; a run on it would train or report
        # on nothing ("held-out success 0.0% (0/0)"). The built-in environments never do.
        if self.env.name in ENVIRONMENTS:
            return self
        user = find_user_environment(self.env.name)
        if user is None:
            return self
        splits = [self.env.split, self.evaluation.split]
        if self.signals.selection == "oracle":
            splits.append("validation")
        empty = user.empty_splits(list(dict.fromkeys(splits)), self.env.seed)
        if empty is not None:
            raise ValueError(empty)
        return self

    @model_validator(mode="after")
    def _oracle_has_validation(self) -> CoevolveConfig:
        if self.signals.selection == "oracle":
            if "validation" not in get_environment(self.env.name).splits:
                raise ValueError(
                    "signals.selection 'oracle' reads a validation split; "
                    f"env {self.env.name!r} has none (use selection 'signals' or 'random')"
                )
            if self.evaluation.split == "validation":
                raise ValueError(
                    "signals.selection 'oracle' reads the validation split, so evaluating on it "
                    "would report a tuned figure: set evaluation.split to heldout"
                )
        return self

    @model_validator(mode="after")
    def _seed_tasks_bound_the_bootstrap(self) -> CoevolveConfig:
        # pool.seed_tasks is the low-resource regime's one setting: a bootstrap agent that
        # had seen more demonstrations than the pool holds would not be low-resource.
        limit = self.pool.seed_tasks
        learns_from_pool = (
            self.env.name == BOOTSTRAP_ENVIRONMENT
            and self.env.split == self.bootstrap.train_split
            and self.policy.model == "bootstrap"
        )
        if limit is None or not learns_from_pool:
            return self
        built_from = self.bootstrap.num_train_tasks
        if built_from is None:
            self.bootstrap.num_train_tasks = limit
        elif built_from > limit:
            raise ValueError(
                f"bootstrap.num_train_tasks {built_from} is above pool.seed_tasks {limit}: the "
                "bootstrap agent would learn from seed tasks the run does not have; drop "
                "bootstrap.num_train_tasks (it follows pool.seed_tasks) or lower it"
            )
        return self

    @model_validator(mode="after")
    def _hard_negatives_train_in_process(self) -> CoevolveConfig:
        if self.hard_negatives.enabled and self.training.launcher != "inprocess":
            raise ValueError(
                "hard_negatives trains its adapters in the loop process, so "
                f"training.launcher {self.training.launcher!r} would not apply: set "
                "training.launcher: inprocess, or hard_negatives.enabled: false"
            )
        return self

    def store_path(self) -> str:
        return self.synthesis.store_path or str(RunFiles(self.run_dir).task_store)

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
                if child is not None:
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
            where = ".".join(parts[: depth + 1])
            allowed = list(model.model_fields)
            raise ConfigError(f"--set {text}: {_unknown_key(where, part, allowed)}")
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
        return _unknown_key(where, loc[-1], list(parent.model_fields) if parent else [])
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        return f"{where}: {error['input']!r} is not allowed; allowed values: {expected}"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if loc else message


def _unknown_key(where: str, key: str, allowed: list[str]) -> str:
    """'unknown key', with a likely intended spelling of ``key`` and the allowed keys."""
    hint = difflib.get_close_matches(key, allowed, n=1)
    suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
    return f"unknown key {where!r}{suggestion}; allowed keys: {', '.join(allowed)}"


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
