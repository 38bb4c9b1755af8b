"""The explorer: independent rounds of interaction with a fresh environment.

Every round starts from a fresh environment reset to the flagged task, so its
interactions are reproducible from the task's setup (``ExplorationRound.setup``).

``OfflineExplorer`` needs no LLM. With the environment's action sampler, the
first round follows the task's reference tool sequence with freshly sampled
values (the same skill on new data); the others are guided random walks over
the focus tools, some starting with a prefix of the reference (to begin near the
interesting state); when a policy is given, the last rounds are its episodes at
a high temperature. Environments without a sampler (BFCL) get policy rounds, or
replays of perturbed references.

``LLMExplorer`` is an agent loop: a chat model with the environment's tools
bound, given the signal-specific exploration goal.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from ...envs.base import Environment, SupportsSampleAction
from ...envs.parsing import ToolCallParseError, parse_tool_calls, render_call
from ...records import FlaggedTrajectory, Observation, SynthesisContext, Task, ToolCall
from ..policy.conversation import opening_messages
from ..policy.policy_interface import Message, Policy, PolicyError, parse_assistant_text
from ..prompts import EXPLORER_PROMPT, POLICY_SYSTEM_PROMPT, fill_environment
from .llm import ReplyError, ask, model_label
from .replies import raise_unless_one_replied
from .role_interfaces import EnvFactory, ExplorationRound, Interaction
from .task_text import call_values, mentions

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z_][\w.]*")


def tool_names(env: Environment) -> list[str]:
    """Names of the tools the environment offers now."""
    return [schema["function"]["name"] for schema in env.tools()]


def focus_tools(context: SynthesisContext, task: Task, known: Sequence[str]) -> list[str]:
    """Tools to explore: those named in the focus patterns, then the reference's, if known."""
    known_set = set(known)
    names = [token for pattern in context.focus_patterns for token in _NAME.findall(pattern)]
    names += [call.name for call in task.reference_calls]
    return [name for name in dict.fromkeys(names) if name in known_set]


def objective_for(context: SynthesisContext, index: int) -> str:
    """Round ``index``'s goal: the objectives in turn, so rounds differ."""
    objectives = context.exploration_objectives or [
        f"Explore the situations around: {context.summary}"
    ]
    return objectives[index % len(objectives)]


def _bare(call: ToolCall) -> ToolCall:
    return ToolCall(name=call.name, arguments=dict(call.arguments))


# --------------------------------------------------------------------------- offline


class OfflineExplorer:
    """Guided random walks (and policy rounds) from fresh environments; no LLM.

    Deterministic given ``seed`` and the flagged trajectory's id (policy rounds
    are as deterministic as the policy). ``policy_rounds`` of the ``rounds`` are
    driven by ``policy`` (default: a third, at least one) when there is one.
    """

    def __init__(
        self,
        rounds: int = 3,
        steps: int = 4,
        seed: int = 0,
        policy: Policy | None = None,
        policy_temperature: float = 1.2,
        *,
        policy_rounds: int | None = None,
        replay_probability: float = 0.5,
        focus_probability: float = 0.75,
        system_prompt: str | None = POLICY_SYSTEM_PROMPT,
    ):
        if rounds < 1 or steps < 1:
            raise ValueError(f"rounds and steps must be >= 1, got {rounds} and {steps}")
        self.rounds = rounds
        self.steps = steps
        self.seed = seed
        self.policy = policy
        self.policy_temperature = policy_temperature
        self.policy_rounds = policy_rounds
        self.replay_probability = replay_probability
        self.focus_probability = focus_probability
        self.system_prompt = system_prompt
        suffix = f"+policy({policy.version})" if policy is not None else ""
        self.name = f"explorer:offline{suffix}"

    async def explore(
        self, item: FlaggedTrajectory, task: Task, context: SynthesisContext, make_env: EnvFactory
    ) -> list[ExplorationRound]:
        probe = make_env()
        probe.reset(task)
        can_sample = isinstance(probe, SupportsSampleAction)
        focus = focus_tools(context, task, tool_names(probe))
        # An environment without a sampler (a user's, BFCL) explores with the policy unless
        # the config sets the policy's rounds; the rest perturb the reference.
        if self.policy is None:
            driven = 0
        elif self.policy_rounds is not None:
            driven = min(self.policy_rounds, self.rounds)
        elif not can_sample:
            driven = self.rounds
        else:
            driven = max(1, self.rounds // 3)

        logs: list[list[Interaction]] = []
        for index in range(self.rounds - driven):
            rng = random.Random(f"explore:{self.seed}:{item.trajectory.id}:{index}")
            if not can_sample:
                logs.append(self._perturbed_reference(task, make_env, rng))
            elif index == 0 and task.turns[0].reference_calls:
                logs.append(self._variation(task, make_env, rng))
            else:
                logs.append(self._walk(task, make_env, rng, focus))
        if driven:
            logs += await self._policy_rounds(task, make_env, driven)
        return [
            ExplorationRound(
                objective=objective_for(context, index),
                setup=dict(task.setup),
                interactions=interactions,
            )
            for index, interactions in enumerate(logs)
        ]

    # -- random walks

    def _walk(
        self, task: Task, make_env: EnvFactory, rng: random.Random, focus: Sequence[str]
    ) -> list[Interaction]:
        env = make_env()
        env.reset(task)
        interactions: list[Interaction] = []
        reference = task.turns[0].reference_calls
        if reference and rng.random() < self.replay_probability:
            for step in reference[: rng.randint(1, len(reference))]:
                interactions.append(Interaction(call=_bare(step), observation=env.step(step)))
        for _ in range(self.steps):
            call = self._sample(env, rng, focus, interactions)
            if call is None:
                break
            interactions.append(Interaction(call=call, observation=env.step(call)))
        return interactions

    def _variation(self, task: Task, make_env: EnvFactory, rng: random.Random) -> list[Interaction]:
        """The reference's tool sequence with freshly sampled values: the same skill, new data."""
        env = make_env()
        env.reset(task)
        interactions: list[Interaction] = []
        for step in task.turns[0].reference_calls:
            call = self._sample(env, rng, [step.name], interactions, tries=8, bias=1.0)
            if call is None:
                break
            interactions.append(Interaction(call=call, observation=env.step(call)))
        return interactions

    def _sample(
        self,
        env: Any,
        rng: random.Random,
        focus: Sequence[str],
        interactions: Sequence[Interaction],
        tries: int = 4,
        bias: float | None = None,
    ) -> ToolCall | None:
        """A sampled action; often the one that reuses most values seen so far.

        Preferring calls whose argument values appeared in earlier observations
        makes walks pass information from lookups into later calls, as real
        tasks do (find the contact, then message that contact id).
        """
        focus_probability = self.focus_probability if bias is None else bias
        names = list(focus) if focus and rng.random() < focus_probability else None
        options: list[ToolCall] = []
        for _ in range(tries if rng.random() < 0.5 or bias is not None else 1):
            call: ToolCall | None = env.sample_action(rng, names)
            if call is None and names:
                call = env.sample_action(rng, None)
            if call is not None:
                options.append(call)
        if not options:
            return None
        seen = "\n".join(i.observation.text for i in interactions if not i.observation.error)

        def reuse(call: ToolCall) -> int:
            return sum(mentions(seen, value) for value in call_values(call))

        return _bare(max(options, key=reuse))  # the first of the best

    def _perturbed_reference(
        self, task: Task, make_env: EnvFactory, rng: random.Random
    ) -> list[Interaction]:
        """Without a sampler: the first turn's reference, cut short and perhaps missing a call."""
        env = make_env()
        env.reset(task)
        calls = list(task.turns[0].reference_calls)
        if not calls:
            return []
        calls = calls[: rng.randint(1, len(calls))]
        if len(calls) > 1 and rng.random() < 0.3:
            del calls[rng.randrange(len(calls) - 1)]
        return [Interaction(call=_bare(c), observation=env.step(c)) for c in calls[: self.steps]]

    # -- the policy at high temperature

    async def _policy_rounds(
        self, task: Task, make_env: EnvFactory, count: int
    ) -> list[list[Interaction]]:
        """``count`` episodes of the task by the policy, in lockstep, up to ``steps`` calls each."""
        policy = self.policy
        assert policy is not None
        envs = [make_env() for _ in range(count)]
        conversations: list[list[Message]] = [
            opening_messages(env.reset(task), self.system_prompt) for env in envs
        ]
        logs: list[list[Interaction]] = [[] for _ in range(count)]
        made = [0] * count
        live = list(range(count))
        needs_tasks = bool(getattr(policy, "needs_tasks", False))
        while live:
            extra: dict[str, Any] = {"tasks": [task] * len(live)} if needs_tasks else {}
            try:
                replies = await policy.generate(
                    [conversations[i] for i in live],
                    [envs[i].tools() for i in live],
                    self.policy_temperature,
                    **extra,
                )
            except PolicyError as err:  # the policy failing ends exploration, not the branch
                log.warning("explorer: policy failed on %s: %s", task.id, err)
                break
            still: list[int] = []
            for i, reply in zip(live, replies, strict=False):
                if reply.error is not None:
                    continue
                conversations[i].append(reply.to_openai())
                if reply.is_final:
                    continue
                for call in reply.tool_calls:
                    observation = envs[i].step(call)
                    logs[i].append(Interaction(call=_bare(call), observation=observation))
                    conversations[i].append(
                        {
                            "role": "tool",
                            "tool_call_id": call.id or "call",
                            "content": observation.text,
                        }
                    )
                    made[i] += 1
                for bad in reply.invalid_tool_calls:
                    conversations[i].append(
                        {"role": "tool", "tool_call_id": bad.id, "content": f"error: {bad.message}"}
                    )
                    made[i] += 1
                if made[i] < self.steps:
                    still.append(i)
            live = still
        return logs


# --------------------------------------------------------------------------- LLM


def exploration_brief(
    item: FlaggedTrajectory,
    task: Task,
    context: SynthesisContext,
    objective: str,
    index: int,
    rounds: int,
    steps: int,
) -> str:
    """The user message of an exploration round."""
    lines = [
        f"Environment: {task.env}. The tools are bound; each call runs for real.",
        f"Flagged task ({', '.join(dict.fromkeys(item.kinds))}): {task.instruction}",
        "Reference solution of that task: "
        + (" ; ".join(render_call(c) for c in task.reference_calls) or "(none)"),
        f"Summary: {context.summary}",
    ]
    if context.failure_cause:
        lines.append(f"Failure cause: {context.failure_cause}")
    if context.instability_pattern:
        lines.append(f"Instability: {context.instability_pattern}")
    if context.focus_patterns:
        lines.append(f"Focus on: {', '.join(context.focus_patterns)}")
    lines += [
        f"Exploration goal (round {index + 1} of {rounds}): {objective}",
        f"You may make up to {steps} tool calls in this round; start now.",
    ]
    return "\n".join(lines)


def with_text_calls(reply: AIMessage, made: int) -> AIMessage:
    """The reply with the calls a server left in its text read as tool calls.

    A server without a tool-call parser (transformers serve; vLLM without
    --enable-auto-tool-choice; llama-server's Qwen2.5 Coder) returns the model's
    ``<tool_call>`` blocks, call lines or JSON call objects (alone or fenced) as content.
    They are parsed as the policy parses them, JSON always (a synthesis role is a
    larger model, whatever format it writes), and the reply is sent back with
    structured calls, so the tool results that follow answer calls the next request
    names. Text that looks like a call and cannot be read is an invalid call (an error
    the model sees), not the end of the round.
    """
    if reply.tool_calls or reply.invalid_tool_calls or not isinstance(reply.content, str):
        return reply
    content, calls, invalid, _form = parse_assistant_text(
        reply.content, call_id_prefix=f"call_{made}", read_json_calls=True
    )
    if not calls and not invalid:
        return reply
    return AIMessage(
        content=content,
        tool_calls=[
            {"name": c.name, "args": c.arguments, "id": c.id, "type": "tool_call"} for c in calls
        ],
        invalid_tool_calls=[
            {
                "name": bad.name,
                "args": bad.raw,
                "id": bad.id,
                "error": bad.message,
                "type": "invalid_tool_call",
            }
            for bad in invalid
        ],
    )


class LLMExplorer:
    """A chat model with the environment's tools bound explores, round by round.

    Rounds are independent (each on a fresh environment) and run concurrently;
    each takes the exploration objectives in turn. A round ends when the model
    answers without tool calls, its ``steps`` calls are spent, or a request fails.
    """

    def __init__(
        self,
        model: Any,
        limiter: asyncio.Semaphore | None = None,
        rounds: int = 2,
        steps: int = 5,
        prompt: str = EXPLORER_PROMPT,
    ):
        if rounds < 1 or steps < 1:
            raise ValueError(f"rounds and steps must be >= 1, got {rounds} and {steps}")
        self.model = model
        self.limiter = limiter
        self.rounds = rounds
        self.steps = steps
        self.prompt = fill_environment(prompt, None)  # an open slot never reaches the model
        self.name = f"explorer:llm({model_label(model)})"

    async def explore(
        self, item: FlaggedTrajectory, task: Task, context: SynthesisContext, make_env: EnvFactory
    ) -> list[ExplorationRound]:
        outcomes = await asyncio.gather(
            *(self._round(item, task, context, make_env, i) for i in range(self.rounds)),
            return_exceptions=True,
        )
        raise_unless_one_replied(outcomes)
        return [outcome for outcome in outcomes if isinstance(outcome, ExplorationRound)]

    async def _round(
        self,
        item: FlaggedTrajectory,
        task: Task,
        context: SynthesisContext,
        make_env: EnvFactory,
        index: int,
    ) -> ExplorationRound:
        env = make_env()
        env.reset(task)
        objective = objective_for(context, index)
        bound = self.model.bind_tools(env.tools())
        brief = exploration_brief(item, task, context, objective, index, self.rounds, self.steps)
        messages: list[BaseMessage] = [SystemMessage(self.prompt), HumanMessage(brief)]
        interactions = await self._converse(bound, env, messages, task, index)
        return ExplorationRound(
            objective=objective, setup=dict(task.setup), interactions=interactions
        )

    async def _converse(
        self,
        bound: Any,
        env: Environment,
        messages: list[BaseMessage],
        task: Task,
        index: int,
    ) -> list[Interaction]:
        """Replies and their calls' results, appended to ``messages``, until the model stops
        calling tools, the calls are spent or a request fails; the calls that ran."""
        interactions: list[Interaction] = []
        made = 0
        while made < self.steps:
            try:
                reply = await ask(bound, messages, self.limiter, model=self.model)
            except ReplyError as err:
                if not interactions:  # nothing explored: the item is rejected with the reason
                    raise
                log.warning(
                    "explorer round %d of %s: %s; keeps what it explored", index, task.id, err
                )
                break
            if not isinstance(reply, AIMessage):
                break
            reply = with_text_calls(reply, made)
            messages.append(reply)
            attempts = [
                (
                    tc.get("id") or f"call_{made}_{n}",
                    tc.get("name"),
                    tc.get("args"),
                    tc.get("error"),
                )
                for n, tc in enumerate([*reply.tool_calls, *reply.invalid_tool_calls])
            ]
            if not attempts:
                break
            for call_id, name, arguments, error in attempts:
                if made >= self.steps:
                    text = "error: the call budget of this round is spent"
                    messages.append(ToolMessage(content=text, tool_call_id=call_id))
                    continue
                if name is None and error:  # text that looked like a call: say why it was not read
                    text = f"error: {error}"
                else:
                    text = self._run(env, name, arguments, interactions).text
                messages.append(ToolMessage(content=text, tool_call_id=call_id))
                made += 1
        return interactions

    @staticmethod
    def _run(
        env: Environment, name: Any, arguments: Any, interactions: list[Interaction]
    ) -> Observation:
        """Parse one model tool call and run it; an unreadable call is an error observation."""
        try:
            [call] = parse_tool_calls({"name": name, "arguments": arguments})
        except (ToolCallParseError, ValueError) as err:
            kind = getattr(err, "kind", "parse_error")
            return Observation(text=f"error: {err}", error=kind)
        observation = env.step(call)
        interactions.append(Interaction(call=call, observation=observation))
        return observation
