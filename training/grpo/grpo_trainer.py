"""GRPO with the environment's verifier as reward: TRL's tool loop, or coevolve's multi-turn rollout.

``training.grpo.rollout`` picks how an episode is played:

- **multi_turn** (``training/grpo/multiturn_rollout.py``, a TRL ``rollout_func``): every
  user turn of the task in one rollout, the model's replies kept as the ids it
  generated, tool results and later user turns appended as rendered ids masked
  out of the loss (``env_mask``), replies parsed as the in-process policy parses
  them (plain call lines too). ``MultiTurnGRPOTrainer``
  (``training/grpo/multiturn_trainer.py``) keeps the batch's rows on the trainer,
  because the rollout_func gets only the prompts, takes the old policy's
  log-probs from the rollout, and runs no forward pass over padding.
- **tool_loop**: TRL's ``environment_factory`` loop, described below.
- **auto** (default): multi_turn when a task has more than one user turn (BFCL
  multi-turn) or TRL has no parser for the model's calls (SmolLM2's plain-calls
  template), tool_loop otherwise (the world's single-turn tasks on the
  bootstrap model's Qwen2.5 template).

The tool loop: TRL 1.16 runs multi-step tool use itself: it samples ``num_generations``
completions per prompt, parses ``<tool_call>`` blocks with the tokenizer's
``response_template``, calls the environment's methods of the same name, appends
the results as tool messages (masked out of the loss) and generates again,
until the model answers without a call or ``max_tool_calling_iterations`` /
``max_completion_length`` is reached. What is wired here:

- **The environment as TRL wants it** (``training/grpo/environment.py``).
  ``environment_class`` builds a class
  with one method per tool schema of the coevolve environment (signature and
  Google-style docstring from the schema, so ``get_json_schema`` reads it);
  every method forwards ``env.step(ToolCall(...))`` and returns the
  observation text, so errors come back as observations exactly as in a
  rollout. ``reset(task=<Task JSON>)`` starts the episode from the dataset row.
- **The reward** is ``environment_score``: the last assistant message without
  calls is the final answer, ``env.end_turn(answer)`` closes the turn, and
  ``env.score()`` (the verifier, in [0, 1]) is the reward. An episode cut off
  while still calling tools is scored as it stands, as the rollout engine does.
- **The prompt** is the opening a rollout starts from (system prompt and the
  query ``env.reset`` returns), rendered as the policy renders it: without tool
  schemas for the in-process bootstrap agent (the template gets
  ``{%- set tools = none %}`` prepended, because TRL passes the environment's
  methods as ``tools=``; 31 schemas would cost thousands of tokens the model never
  saw in training), with them when the policy's prompts carry them
  (``tools_in_prompt``, e.g. an endpoint policy). The
  template stays prefix-preserving and tool-aware, and the tokenizer gets the
  ``response_template`` TRL's ``add_response_schema`` assigns the original
  template (Qwen2.5's ``<tool_call>`` JSON format).

Limitations of this TRL version's loop (not of multi_turn), accepted here:
- **One user turn per episode**: TRL ends the episode at the first answer
  without calls; there is no hook for a next user message. With
  ``grpo.rollout: tool_loop``, tasks with more than one turn are left out of
  GRPO (logged); ``auto`` plays them with the multi-turn rollout instead.
- A call of a name the environment has no method for is answered by TRL
  (``{'error': 'Tool x not found.'}``), not by the environment's
  ``unknown_tool`` observation; arguments that are not a JSON object fail the
  same way. Both still end in a low reward.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from ...agents.policy.conversation import opening_messages
from ...agents.policy.policy_interface import Message
from ...envs.adaptation import adapt, adapt_system_prompt
from ...envs.base import Environment
from ...records import Task
from ..config import TrainingConfig
from ..datasets import TrainingConversation
from ..seal import (
    CapabilityState,
    ReweightConfig,
    label_counts,
    reweight_step,
    scale_advantages,
)
from ..trainer_common import micro_batches
from .environment import EpisodeEnvironment, environment_class, environment_score
from .multiturn_trainer import multi_turn_trainer_class

logger = logging.getLogger(__name__)

# Prepended to the chat template: TRL renders every prompt with tools=<the
# environment's methods>; the policy is prompted without tool schemas.
NO_TOOLS_IN_PROMPT = "{%- set tools = none %}\n"


def grpo_rows(
    tasks: Sequence[Task],
    make_env: Callable[[], Environment],
    system_prompt: str | None,
    minimum: int = 1,
    multi_turn: bool = False,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Dataset rows (``prompt`` messages, ``task`` JSON) and the union of the tasks' tool schemas.

    Rows are repeated (in order) up to ``minimum`` so a round always has its tasks.
    Tasks of several user turns are kept only for the ``multi_turn`` rollout.
    """
    rows, schemas, names = [], [], set()
    for task in tasks:
        if len(task.turns) > 1 and not multi_turn:
            logger.info(
                "GRPO leaves out %s: %d user turns (TRL's tool loop plays one; "
                "grpo.rollout: multi_turn plays them all)",
                task.id,
                len(task.turns),
            )
            continue
        env = make_env()
        query = env.reset(task)
        for schema in env.tools():
            name = schema.get("function", schema).get("name")
            if name not in names:
                names.add(name)
                schemas.append(schema)
        prompt = opening_messages(query or "", adapt_system_prompt(env, system_prompt))
        rows.append({"prompt": prompt, "task": task.model_dump_json()})
    if rows and len(rows) < minimum:
        rows = [rows[index % len(rows)] for index in range(minimum)]
    return rows, schemas


def prepare_tokenizer(tokenizer: Any, tools_in_prompt: bool = False) -> Any:
    """Give the tokenizer a response parser for its template, then, unless the policy's
    prompts carry the tool schemas (``tools_in_prompt``), drop them from prompts."""
    from trl.chat_template_utils import add_response_schema

    template = tokenizer.chat_template or ""
    if template.startswith(NO_TOOLS_IN_PROMPT):
        return tokenizer
    if getattr(tokenizer, "response_template", None) is None:
        try:
            add_response_schema(tokenizer)
        except ValueError as err:
            raise ValueError(
                "GRPO needs to parse tool calls from the model's replies, and TRL knows no parser "
                "for this model's chat template; use a model with TRL's Qwen2.5 template (the "
                "bootstrap model has it) or set tokenizer.response_template"
            ) from err
    if not tools_in_prompt:
        tokenizer.chat_template = NO_TOOLS_IN_PROMPT + template
    return tokenizer


def trl_parses_calls(tokenizer: Any) -> bool:
    """Whether TRL's tool loop can read tool calls from this tokenizer's replies."""
    from trl.chat_template_utils import add_response_schema

    if getattr(tokenizer, "response_template", None) is not None:
        return True
    try:
        # On a shallow copy: only asking, the tokenizer itself stays as it is.
        add_response_schema(copy.copy(tokenizer))
    except ValueError:
        return False
    return True


def choose_rollout(config: TrainingConfig, tasks: Sequence[Task], tokenizer: Any) -> str:
    """``tool_loop`` or ``multi_turn``: the config's choice, or for ``auto`` multi_turn when a
    task has more than one user turn, TRL cannot parse the model's calls, or reference
    episodes are asked for."""
    if config.grpo.rollout != "auto":
        return config.grpo.rollout
    if config.grpo.reference_episodes:
        return "multi_turn"  # the only rollout that plays a scripted reference
    if any(len(task.turns) > 1 for task in tasks) or not trl_parses_calls(tokenizer):
        return "multi_turn"
    return "tool_loop"


def vllm_arguments(config: TrainingConfig) -> dict[str, Any]:
    """GRPOConfig's vLLM settings for ``training.grpo.vllm`` ({} when off)."""
    if config.grpo.vllm == "off":
        return {}
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            f"training.grpo.vllm is {config.grpo.vllm!r} but vllm is not installed; "
            "pip install 'coevolve[vllm]' on a CUDA machine, or set training.grpo.vllm: off"
        )
    arguments: dict[str, Any] = {"use_vllm": True, "vllm_mode": config.grpo.vllm}
    if config.grpo.vllm == "colocate":
        arguments["vllm_gpu_memory_utilization"] = config.grpo.vllm_gpu_memory_utilization
        arguments["vllm_max_model_length"] = config.max_length
    else:
        arguments["vllm_server_base_url"] = config.grpo.vllm_server_url
    return arguments


def make_grpo_trainer(
    config: TrainingConfig,
    *,
    model_dir: str | Path,
    previous_adapter: str | Path | None,
    tokenizer: Any,
    tasks: Sequence[Task],
    make_env: Callable[[], Environment],
    system_prompt: str | None,
    arguments: dict[str, Any],
    capability_state: CapabilityState | None = None,
    tools_in_prompt: bool = False,
    replay_conversations: Sequence[list[Message] | TrainingConversation] = (),
) -> tuple[Any, int, str | None]:
    """(GRPOTrainer, tasks used, None) or (None, 0, reason) when no task can be played.

    With ``config.grpo.replay_coefficient`` and ``replay_conversations`` every step also
    takes the SFT loss of those conversations (``coevolve.training.grpo.replay_anchor``).

    With ``config.seal.adaptation.enable`` the episodes run in SEAL's training
    interface (``coevolve.envs.adaptation``); with ``config.seal.reweight.enable``
    the trainer is a ``SealGRPOTrainer`` whose ``capability_state`` (given, or a
    fresh one) the caller may save after training.
    """
    import transformers
    from datasets import Dataset

    from ..adapters import load_trainable_model

    def training_env() -> Any:
        return adapt(make_env(), "train", config.seal.adaptation)

    rollout = choose_rollout(config, tasks, tokenizer)
    multi_turn = rollout == "multi_turn"
    rows, schemas = grpo_rows(
        tasks,
        training_env,
        system_prompt,
        minimum=config.grpo.prompts_per_step,
        multi_turn=multi_turn,
    )
    if not rows:
        reason = (
            "no single-turn task to roll out (TRL's tool loop plays one user turn; set "
            "training.grpo.rollout: multi_turn or auto to play every turn)"
        )
        return None, 0, reason
    examples = len({row["task"] for row in rows})
    replay_rows: list[dict[str, Any]] = []
    if config.grpo.replay_coefficient and replay_conversations:
        from ..tokenized_datasets import sft_dataset

        # With the policy's own template: the tool loop below rewrites the tokenizer's.
        replay_rows = list(sft_dataset(tokenizer, replay_conversations))
    trainer_arguments, reward_funcs = _episode_arguments(
        config, training_env, schemas, tokenizer, multi_turn, tools_in_prompt
    )
    args = _grpo_arguments(config, arguments)
    model = load_trainable_model(model_dir, previous_adapter)
    transformers.logging.set_verbosity_error()
    trainer_class = _trainer_class(
        config, multi_turn, capability_state, replay_rows, trainer_arguments
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*experimental feature.*")
        trainer = trainer_class(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=(
                config.lora.to_peft(getattr(model.config, "num_hidden_layers", None))
                if previous_adapter is None
                else None
            ),
            **trainer_arguments,
        )
    return trainer, examples, None


def _episode_arguments(
    config: TrainingConfig,
    training_env: Callable[[], Any],
    schemas: list[dict[str, Any]],
    tokenizer: Any,
    multi_turn: bool,
    tools_in_prompt: bool,
) -> tuple[dict[str, Any], list[Any]]:
    """How the trainer plays its episodes, and the reward functions that score them: our
    multi-turn rollout (every user turn, the verifier's score), or TRL's tool loop over an
    environment per episode (one user turn; the tokenizer learns to parse the calls)."""
    if multi_turn:
        from .multiturn_rollout import MultiTurnRollout, verifier_score
        from .reference_episodes import ReferenceEpisodes

        rollout_func = MultiTurnRollout(
            training_env,
            tools_in_prompt=tools_in_prompt,
            max_tool_calls=config.grpo.max_tool_calls,
            max_completion_tokens=config.grpo.max_completion_length,
            max_reply_tokens=config.grpo.max_reply_tokens,
            reference_episodes=(
                ReferenceEpisodes(training_env) if config.grpo.reference_episodes else None
            ),
        )
        return {"rollout_func": rollout_func}, [verifier_score]
    prepare_tokenizer(tokenizer, tools_in_prompt)
    episode_class = environment_class(schemas)

    def factory() -> EpisodeEnvironment:
        return episode_class(training_env())

    return {"environment_factory": factory}, [environment_score]


def _grpo_arguments(config: TrainingConfig, arguments: dict[str, Any]) -> Any:
    """TRL's ``GRPOConfig``: the trainers' common ``arguments`` with GRPO's batches,
    learning rate, groups, sampling, clipping and generation backend."""
    from trl import GRPOConfig

    return GRPOConfig(
        **{
            **arguments,
            **micro_batches(config, config.grpo.micro_batch_size),
            "learning_rate": config.grpo.learning_rate or config.learning_rate,
        },
        num_generations=config.grpo.num_generations,
        generation_batch_size=config.grpo.prompts_per_step * config.grpo.num_generations,
        max_completion_length=config.grpo.max_completion_length,
        max_tool_calling_iterations=config.grpo.max_tool_calls,
        temperature=config.grpo.temperature,
        top_p=1.0,
        beta=config.grpo.beta,
        epsilon=config.grpo.epsilon,
        epsilon_high=config.grpo.epsilon_high,
        disable_dropout=config.grpo.disable_dropout,
        log_completions=False,
        **vllm_arguments(config),
    )


def _trainer_class(
    config: TrainingConfig,
    multi_turn: bool,
    capability_state: CapabilityState | None,
    replay_rows: list[dict[str, Any]],
    trainer_arguments: dict[str, Any],
) -> Any:
    """The GRPO trainer class, with SEAL's reweighting, dynamic sampling and the replay
    anchor layered on as the config asks; each layer's arguments go into
    ``trainer_arguments``."""
    from trl import GRPOTrainer

    seal = config.seal
    trainer_class: Any = multi_turn_trainer_class() if multi_turn else GRPOTrainer
    if seal.reweight.enable:
        trainer_class = seal_grpo_trainer_class(multi_turn)
        trainer_arguments["seal_settings"] = seal.reweight
        trainer_arguments["capability_state"] = capability_state or CapabilityState()
    if config.grpo.dynamic_sampling:
        from .dynamic_sampling import dynamic_sampling_trainer_class

        trainer_class = dynamic_sampling_trainer_class(trainer_class)
        trainer_arguments["max_refills"] = config.grpo.max_refills
    if replay_rows:
        from .replay_anchor import replay_anchor_trainer_class

        trainer_class = replay_anchor_trainer_class(trainer_class)
        trainer_arguments["replay_rows"] = replay_rows
        trainer_arguments["replay_coefficient"] = config.grpo.replay_coefficient
    return trainer_class


@cache
def seal_grpo_trainer_class(multi_turn: bool = False) -> type:
    """``SealGRPOTrainer``: TRL's GRPOTrainer (``multi_turn``: ``MultiTurnGRPOTrainer``) with
    SEAL's diagnosis-guided advantage weights.

    After TRL computes the group-normalised advantages of a generation batch,
    every episode is diagnosed (from its environment in the tool loop, from its
    ``Trajectory`` in the multi-turn rollout), the batch's labels and
    rewards (gathered over processes) update the capability state (and, when
    dynamic, the label weights), and each local advantage is multiplied by the
    episode's weight ``clip(mean rho(label), min_scale, max_scale)``. The update
    happens once per generation batch (TRL generates once every
    ``steps_per_generation`` optimisation steps; 1 with this project's settings).
    Evaluation batches are left alone.
    """
    import torch
    from accelerate.utils import gather_object
    from trl import GRPOTrainer

    base: type = multi_turn_trainer_class() if multi_turn else GRPOTrainer

    class SealGRPOTrainer(base):
        def __init__(
            self,
            *args: Any,
            seal_settings: ReweightConfig | None = None,
            capability_state: CapabilityState | None = None,
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            self.seal_settings = seal_settings or ReweightConfig(enable=True)
            self.capability_state = capability_state or CapabilityState()
            self.last_seal_weights: list[float] = []
            self.last_seal_labels: list[list[str]] = []

        def _episode_outcomes(self) -> tuple[list[list[str]], list[float]] | None:
            """Labels and rewards of this process's episodes of the last generation batch."""
            if self.environments:
                return (
                    [environment._diagnosis() for environment in self.environments],
                    [float(environment._score or 0.0) for environment in self.environments],
                )
            episodes = getattr(self.rollout_func, "last_episodes", None)
            if not episodes:
                return None
            return (
                [episode.diagnosis() for episode in episodes],
                [float(episode.score or 0.0) for episode in episodes],
            )

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            output = super()._generate_and_score_completions(inputs)
            if self.model is None or not self.model.training:
                return output
            outcomes = self._episode_outcomes()
            if outcomes is None:
                return output
            labels, rewards = outcomes
            all_labels = gather_object(labels)
            all_rewards = gather_object(rewards)
            weights = reweight_step(
                self.capability_state, self.seal_settings, all_labels, all_rewards, local=labels
            )
            advantages = output["advantages"]
            scaled = scale_advantages(advantages.tolist(), weights, self.seal_settings.apply_to)
            output["advantages"] = torch.tensor(
                scaled, dtype=advantages.dtype, device=advantages.device
            )
            self.last_seal_weights, self.last_seal_labels = weights, labels
            metrics = self._metrics["train"]
            metrics["seal/weight_mean"].append(sum(weights) / len(weights))
            for label, count in label_counts(all_labels).items():
                metrics[f"seal/labels/{label}"].append(float(count))
            return output

    return SealGRPOTrainer
