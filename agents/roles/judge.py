"""The judge: validate a candidate task by replaying it in a fresh environment.

``ExecutableJudge`` decides from the replay alone; ``LLMJudge`` runs the same
replay and then asks a model for a verdict on the evidence. Acceptance is
``Verdict.accepted``: judged successful, or the environment still rewarded it.

The replay's reward (``execution_reward``) is the verifier's score only when
the replay itself was sound: every call succeeded (a domain error the actions
recover from, by retrying the same tool later or by a later call on the same
values, counts as sound), the task is not
solved by doing nothing, and an expected answer appears in some observation.
Otherwise it is 0 — the world's verifier compares the end state with a replay of
the very same calls, so it would score almost any candidate 1.0.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, ConfigDict, Field

from ...common.errors import PROGRAMMING_ERRORS
from ...envs.base import (
    Environment,
    answer_in_observations,
    answer_matches,
    replay_reference,
    unsupported_answer,
)
from ...envs.parsing import UNREADABLE_CALL, render_call
from ...records import CandidateTask, Step, Task, ToolCall, Turn, Verdict, is_success
from ..prompts import JUDGE_PROMPT, fill_environment
from .llm import StructuredOutputError, model_label, structured_call
from .role_interfaces import EnvFactory

log = logging.getLogger(__name__)

API_ERRORS = frozenset({"unknown_tool"})
PARAMETER_ERRORS = frozenset({"bad_arguments", "bad_json", "parse_error", UNREADABLE_CALL})


def probe_task(candidate: CandidateTask, env_name: str) -> Task:
    """The candidate as a runnable Task (provenance is added later by candidate_to_task)."""
    return Task(
        id="candidate",
        env=env_name,
        family="synthesized",
        turns=[Turn(query=candidate.query, reference_calls=list(candidate.minimal_actions))],
        reference_answer=candidate.reference_answer,
        setup=dict(candidate.setup),
        source="synthesized",
        parent_task_id=candidate.parent_task_id,
        signal=candidate.signal,
    )


@dataclass
class Execution:
    """What replaying a candidate's minimal actions showed."""

    steps: list[Step] = field(default_factory=list)
    score: float = 0.0
    fatal: str | None = None  # the replay could not run at all
    api_problems: list[str] = field(default_factory=list)
    parameter_problems: list[str] = field(default_factory=list)
    flow_problems: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    result_problems: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return (
            self.api_problems + self.parameter_problems + self.flow_problems + self.result_problems
        )

    @property
    def sound(self) -> bool:
        return self.fatal is None and not self.problems

    @property
    def reward(self) -> float:
        return self.score if self.sound else 0.0

    def verdict(self) -> Verdict:
        """The executable verdict: success iff the replay is sound and scores 1.0."""
        if self.fatal is not None:
            return Verdict(
                success=False,
                reason=self.fatal,
                api_match=False,
                parameter_usage=False,
                logical_flow=False,
                final_result=False,
                execution_reward=0.0,
            )
        success = self.sound and is_success(self.score)
        if success:
            reason = f"replayed {len(self.steps)} call(s) without errors; verifier score 1.00"
            if self.recovered:
                reason += f" (recovered: {'; '.join(self.recovered)})"
        else:
            reason = "; ".join(self.problems) or f"verifier score {self.score:.2f} < 1.00"
        return Verdict(
            success=success,
            reason=reason,
            api_match=not self.api_problems,
            parameter_usage=not self.parameter_problems,
            logical_flow=not self.flow_problems,
            final_result=not self.result_problems and is_success(self.score),
            failed_or_skipped_steps=self.failed_steps(),
            execution_reward=min(max(self.reward, 0.0), 1.0),
        )

    def failed_steps(self) -> list[str]:
        return [
            f"step {n} {render_call(s.call) if s.call else '?'}: {s.observation.text}"
            for n, s in enumerate(self.steps, 1)
            if s.observation.error
        ]


def _recovers(failed: ToolCall | None, later: ToolCall | None) -> bool:
    """A later call that answers a failed one: the same tool again, or a call on the same
    values (a contact not found, then added under that name)."""
    if failed is None or later is None:
        return False
    if later.name == failed.name:
        return True
    values = {str(v) for v in failed.arguments.values()}
    return bool(values) and values <= {str(v) for v in later.arguments.values()}


def _replay(env: Environment, task: Task, calls: bool = True) -> tuple[float, list[Step], str]:
    """``replay_reference``, and what the environment raised ("" if nothing); bugs of ours raise."""
    # A boundary: a setup the environment cannot start from, or a checker (BFCL's is
    # third-party code) failing on the candidate's calls, costs this candidate only.
    try:
        score, steps = replay_reference(env, task, calls=calls)
    except PROGRAMMING_ERRORS:
        raise
    except Exception as err:
        return 0.0, [], f"{type(err).__name__}: {err}"
    return score, steps, ""


SELF_REFERENTIAL = "self-referential"
# Questions whose answer is a count or an amount: "How many copies are left?" -> "2".
_ASKS_FOR_A_NUMBER = re.compile(r"\bhow (?:many|much)\b", re.IGNORECASE)
_NUMBER = re.compile(r"\d")


def self_reference(candidate: CandidateTask) -> str | None:
    """Why a question task is self-referential, or None: a rule of curation.

    A question's answer must be a value the calls read, answering what the request asks.
    Three ways a written task fails that (the task writer wrote all three):

    - the answer is a value the request itself gives: read back, not looked up;
    - the request names one of its calls' argument values twice, as the value it gives
      and as what it asks about ("I'm Cleo.Park@mail.com. How many copies of
      Cleo.Park@mail.com are available?" for find_member(email=...), answer "0"): the
      one value it has is both the key and the question;
    - "how many" or "how much" answered by no number.

    "What is Ana's phone number?" -> find_contact(name="Ana") -> "555-0101" is none of
    these: the answer is a new value an observation shows."""
    answer, query = candidate.reference_answer, candidate.query
    if answer is None:
        return None
    if answer_matches(query, answer):
        return f"{SELF_REFERENTIAL}: the answer {answer!r} is a value the request itself gives"
    values = {
        str(value).strip()
        for call in candidate.minimal_actions
        for value in call.arguments.values()
        if isinstance(value, str) and len(value.strip()) > 1
    }
    for value in sorted(values):
        said = re.findall(rf"(?<![\w-]){re.escape(value)}(?![\w-])", query, re.IGNORECASE)
        if len(said) > 1:
            return (
                f"{SELF_REFERENTIAL}: the request names {value!r} twice, as the value it gives "
                "and as what it asks about"
            )
    if _ASKS_FOR_A_NUMBER.search(query) and not _NUMBER.search(answer):
        return (
            f"{SELF_REFERENTIAL}: the answer {answer!r} does not answer the request, which "
            "asks how many or how much"
        )
    return None


def execute_candidate(candidate: CandidateTask, make_env: EnvFactory) -> Execution:
    """Replay the minimal actions in a fresh environment and check what happened.

    What the environment raises on the candidate is the verdict's reason; bugs of
    ours (``PROGRAMMING_ERRORS``) raise.
    """
    execution = Execution()
    env = make_env()
    task = probe_task(candidate, env.name)
    score, execution.steps, failure = _replay(env, task)
    if failure:
        execution.fatal = f"replay failed: {failure}"
        return execution
    execution.score = min(max(float(score), 0.0), 1.0)

    for number, step in enumerate(execution.steps, 1):
        error = step.observation.error
        if not error:
            continue
        name = step.call.name if step.call else "?"
        where = f"step {number} {name} failed ({error}): {step.observation.text}"
        if error in API_ERRORS:
            execution.api_problems.append(where)
        elif error in PARAMETER_ERRORS:
            execution.parameter_problems.append(where)
        elif any(
            _recovers(step.call, later.call) and not later.observation.error
            for later in execution.steps[number:]
        ):
            execution.recovered.append(where)
        else:
            execution.flow_problems.append(where)

    answer = candidate.reference_answer
    if answer is not None and not answer_in_observations(execution.steps, answer):
        execution.result_problems.append(unsupported_answer(answer))
    referential = self_reference(candidate)
    if referential is not None:
        execution.result_problems.append(referential)
    if not is_success(execution.score):
        execution.result_problems.append(
            f"the verifier scores the replay {execution.score:.2f}, not 1.00"
        )
    elif not execution.problems:
        # Doing nothing that the environment cannot even score is not a trivial task.
        null_score, _, _ = _replay(make_env(), task, calls=False)
        if is_success(null_score):
            execution.result_problems.append(
                "the task is trivial: doing nothing already scores 1.00"
            )
    return execution


class ExecutableJudge:
    """Validation by environment interaction alone."""

    name = "judge:offline"

    async def judge(self, candidate: CandidateTask, make_env: EnvFactory) -> Verdict:
        return execute_candidate(candidate, make_env).verdict()


# --------------------------------------------------------------------------- LLM


class JudgeReply(BaseModel):
    """The model's verdict."""

    model_config = ConfigDict(extra="ignore")

    api_match: bool = Field(description="Every call uses the right, existing tool.")
    parameter_usage: bool = Field(
        description="Argument values come from the query or observations."
    )
    logical_flow: bool = Field(description="Sensible order, lookups first, nothing superfluous.")
    final_result: bool = Field(description="The actions fulfil the query completely.")
    failed_or_skipped_steps: list[str] = Field(
        default_factory=list, description="Calls that failed or steps that are missing."
    )
    success: bool = Field(description="The task is clear, solvable and correctly solved.")
    reason: str = Field(description="One or two sentences.")


def judge_request(candidate: CandidateTask, execution: Execution) -> str:
    lines = [f"User query: {candidate.query}"]
    if candidate.description and candidate.description != candidate.query:
        lines.append(f"Task description: {candidate.description}")
    if candidate.reference_answer is not None:
        lines.append(f"Expected answer contains: {candidate.reference_answer}")
    lines.append("Minimal actions, replayed in a fresh environment:")
    for number, step in enumerate(execution.steps, 1):
        observation = step.observation
        tag = f"error[{observation.error}]: " if observation.error else ""
        call = render_call(step.call) if step.call else "?"
        lines.append(f"  {number}. {call} -> {tag}{observation.text}")
    lines.append(f"Environment verifier score of this replay: {execution.score:.2f}")
    checks = execution.problems + [f"recovered: {r}" for r in execution.recovered]
    lines.append("Automatic checks: " + ("; ".join(checks) if checks else "no problems found"))
    return "\n".join(lines)


class LLMJudge:
    """The executable replay, then a chat model's verdict on its evidence."""

    def __init__(
        self, model: Any, limiter: asyncio.Semaphore | None = None, prompt: str = JUDGE_PROMPT
    ):
        self.model = model
        self.limiter = limiter
        self.prompt = fill_environment(prompt, None)  # an open slot never reaches the model
        self.name = f"judge:llm({model_label(model)})"

    async def judge(self, candidate: CandidateTask, make_env: EnvFactory) -> Verdict:
        execution = execute_candidate(candidate, make_env)
        if execution.fatal is not None:
            return execution.verdict()  # nothing ran: no evidence to show a model
        reward = min(max(execution.reward, 0.0), 1.0)
        messages = [SystemMessage(self.prompt), HumanMessage(judge_request(candidate, execution))]
        try:
            reply = await structured_call(self.model, JudgeReply, messages, self.limiter)
        except StructuredOutputError as err:
            log.warning("judge reply unreadable: %s", err)
            return Verdict(
                success=False,
                reason=f"judge reply unreadable: {_short(str(err))}",
                failed_or_skipped_steps=execution.failed_steps(),
                execution_reward=reward,
            )
        reason = reply.reason.strip() or ("judged valid" if reply.success else "judged invalid")
        if execution.problems:
            reason += f" [replay: {'; '.join(execution.problems)}]"
        return Verdict(
            success=reply.success,
            reason=reason,
            api_match=reply.api_match,
            parameter_usage=reply.parameter_usage,
            logical_flow=reply.logical_flow,
            final_result=reply.final_result,
            failed_or_skipped_steps=list(
                dict.fromkeys([*reply.failed_or_skipped_steps, *execution.failed_steps()])
            ),
            execution_reward=reward,
        )


def _short(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
