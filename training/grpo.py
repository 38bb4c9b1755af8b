"""GRPO with the environment's verifier as reward, through TRL's ``environment_factory``.

TRL 1.16 runs multi-step tool use itself: it samples ``num_generations``
completions per prompt, parses ``<tool_call>`` blocks with the tokenizer's
``response_template``, calls the environment's methods of the same name, appends
the results as tool messages (masked out of the loss) and generates again,
until the model answers without a call or ``max_tool_calling_iterations`` /
``max_completion_length`` is reached. What is wired here:

- **The environment as TRL wants it.** ``environment_class`` builds a class
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
  query ``env.reset`` returns), rendered *without tool schemas*, as
  ``LocalPolicy`` renders it: the template gets ``{%- set tools = none %}``
  prepended (TRL passes the environment's methods as ``tools=``; 31 schemas
  would cost thousands of tokens the model never saw in training). The
  template stays prefix-preserving and tool-aware, and the tokenizer gets the
  ``response_template`` TRL's ``add_response_schema`` assigns the original
  template (Qwen2.5's ``<tool_call>`` JSON format).

Limitations of this TRL version's loop, accepted here:
- **One user turn per episode**: TRL ends the episode at the first answer
  without calls; there is no hook for a next user message. Tasks with more
  than one turn (BFCL multi-turn) are left out of GRPO (logged); the world's
  tasks are all single-turn.
- A call of a name the environment has no method for is answered by TRL
  (``{'error': 'Tool x not found.'}``), not by the environment's
  ``unknown_tool`` observation; arguments that are not a JSON object fail the
  same way. Both still end in a low reward.
"""

from __future__ import annotations

import inspect
import keyword
import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..agents.conversation import opening_messages
from ..agents.policy import Message
from ..envs.base import Environment
from ..records import Task, ToolCall
from .config import TrainingConfig

logger = logging.getLogger(__name__)

# Prepended to the chat template: TRL renders every prompt with tools=<the
# environment's methods>; the policy is prompted without tool schemas.
NO_TOOLS_IN_PROMPT = "{%- set tools = none %}\n"

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}
_RESERVED = frozenset({"reset", "get_reward"})


class EpisodeEnvironment:
    """A coevolve environment as TRL's ``environment_factory`` wants it (tools added by subclassing)."""

    def __init__(self, env: Environment) -> None:
        self._env = env
        self._task: Task | None = None

    def reset(self, task: str | None = None, **_: Any) -> None:
        """Start the episode of the row's task (``task``: the Task as JSON)."""
        if task is None:
            raise ValueError("GRPO dataset rows need a 'task' column (the Task as JSON)")
        self._task = Task.model_validate_json(task)
        self._env.reset(self._task)
        return None  # the query is already the prompt's user message

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        return self._env.step(ToolCall(name=name, arguments=arguments)).text

    def _finish(self, answer: str | None) -> float:
        """Close the turn with the final answer (None: cut off) and return the verifier's score."""
        if answer is not None:
            self._env.end_turn(answer)
        return float(self._env.score())


def _tool_method(name: str, function: dict[str, Any]) -> Callable[..., str]:
    parameters = function.get("parameters") or {}
    properties: dict[str, Any] = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())

    def method(self: EpisodeEnvironment, **arguments: Any) -> str:
        return self._call(name, arguments)

    signature = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    doc_args = []
    for parameter, spec in properties.items():
        if not parameter.isidentifier() or keyword.iskeyword(parameter):
            continue  # still accepted through **arguments; only undocumented
        kind = _JSON_TYPES.get(str(spec.get("type")), str)
        annotation = kind if parameter in required else kind | None
        signature.append(
            inspect.Parameter(
                parameter,
                inspect.Parameter.KEYWORD_ONLY,
                default=inspect.Parameter.empty if parameter in required else None,
                annotation=annotation,
            )
        )
        annotations[parameter] = annotation
        description = " ".join(str(spec.get("description") or parameter).split())
        doc_args.append(f"    {parameter}: {description}")
    annotations["return"] = str
    description = " ".join(str(function.get("description") or name).split())
    doc = description
    if doc_args:
        doc += "\n\nArgs:\n" + "\n".join(doc_args)
    doc += "\n\nReturns:\n    The tool's result."
    method.__name__ = method.__qualname__ = name
    method.__doc__ = doc
    method.__annotations__ = annotations
    method.__signature__ = inspect.Signature(signature, return_annotation=str)  # type: ignore[attr-defined]
    return method


def environment_class(tool_schemas: Sequence[dict[str, Any]]) -> type[EpisodeEnvironment]:
    """An ``EpisodeEnvironment`` subclass with one method per tool (OpenAI function schemas)."""
    namespace: dict[str, Any] = {}
    for schema in tool_schemas:
        function = schema.get("function", schema)
        name = str(function.get("name", ""))
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
            logger.warning("tool %r cannot be a method name; GRPO episodes cannot call it", name)
            continue
        if name in _RESERVED or name in namespace:
            continue
        namespace[name] = _tool_method(name, function)
    return type("GRPOToolEnvironment", (EpisodeEnvironment,), namespace)


def environment_score(
    completions: list[list[Message]], environments: list[EpisodeEnvironment], **_: Any
) -> list[float]:
    """Reward: the verifier's score of each finished episode (its last call-free message is the answer)."""
    rewards = []
    for completion, environment in zip(completions, environments, strict=True):
        answer = None
        if completion:
            last = completion[-1]
            if last.get("role") == "assistant" and not last.get("tool_calls"):
                answer = str(last.get("content") or "")
        rewards.append(environment._finish(answer))
    return rewards


def grpo_rows(
    tasks: Sequence[Task],
    make_env: Callable[[], Environment],
    system_prompt: str | None,
    minimum: int = 1,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Dataset rows (``prompt`` messages, ``task`` JSON) and the union of the tasks' tool schemas.

    Rows are repeated (in order) up to ``minimum`` so a round always has its tasks.
    """
    rows, schemas, names = [], [], set()
    for task in tasks:
        if len(task.turns) > 1:
            logger.info(
                "GRPO leaves out %s: %d user turns (TRL plays one)", task.id, len(task.turns)
            )
            continue
        env = make_env()
        query = env.reset(task)
        for schema in env.tools():
            name = schema.get("function", schema).get("name")
            if name not in names:
                names.add(name)
                schemas.append(schema)
        rows.append(
            {"prompt": opening_messages(query or "", system_prompt), "task": task.model_dump_json()}
        )
    if rows and len(rows) < minimum:
        rows = [rows[index % len(rows)] for index in range(minimum)]
    return rows, schemas


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Give the tokenizer a response parser for its template, then drop tool schemas from prompts."""
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
    tokenizer.chat_template = NO_TOOLS_IN_PROMPT + template
    return tokenizer


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
) -> tuple[Any, int, str | None]:
    """(GRPOTrainer, tasks used, None) or (None, 0, reason) when no task can be played."""
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from .trainers import load_trainable_model

    rows, schemas = grpo_rows(tasks, make_env, system_prompt, minimum=config.grpo_prompts_per_step)
    if not rows:
        return None, 0, "no single-turn task to roll out (TRL's tool loop plays one user turn)"
    examples = len({row["task"] for row in rows})
    prepare_tokenizer(tokenizer)
    episode_class = environment_class(schemas)

    def factory() -> EpisodeEnvironment:
        return episode_class(make_env())

    args = GRPOConfig(
        **arguments,
        num_generations=config.grpo_num_generations,
        generation_batch_size=config.grpo_prompts_per_step * config.grpo_num_generations,
        max_completion_length=config.grpo_max_completion_length,
        max_tool_calling_iterations=config.grpo_max_tool_calls,
        temperature=config.grpo_temperature,
        top_p=1.0,
        beta=config.grpo_beta,
        epsilon=config.grpo_epsilon,
        epsilon_high=config.grpo_epsilon_high,
        log_completions=False,
    )
    model = load_trainable_model(model_dir, previous_adapter)
    reward_funcs: list[Any] = [environment_score]
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*experimental feature.*")
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=config.lora.to_peft() if previous_adapter is None else None,
            environment_factory=factory,
        )
    return trainer, examples, None
