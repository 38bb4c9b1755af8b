"""Prompts, as constants. Each is the default of a config field, so a run can override it.

The synthesis roles' prompts hold slots that the environment fills, in its own words
(``EnvironmentBrief``: a user environment's docstrings and tools, the world's and BFCL's
own text): ``{environment}`` (what it is, its tools, how its ids look) and one slot per
example (``EXAMPLE_SLOTS``: an action pattern, its lookups, ...), so that no environment's
prompt names another's things. ``fill_environment`` fills them when the roles are built
(``agents/roles/role_factory.py``).

The policy's system prompt (``policy.system_prompt``) is the world's by default; on a
user's environment the default reads ``ENVIRONMENT_POLICY_PROMPT`` filled from its brief
instead (``policy_system_prompt``), and a config's own text is used as written."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..envs.brief import EnvironmentBrief

# The policy's system prompt on the built-in environments (the world, BFCL). Short on
# purpose: the bootstrap model sees it in every training example, and endpoint models get
# the tool schemas separately.
POLICY_SYSTEM_PROMPT = (
    "You operate the user's apps by calling tools. Call one tool at a time, read its result, "
    "and when the request is done reply with a short final answer."
)

# The policy's system prompt on a user's environment, where the config keeps the default:
# what the environment is in its own words, then the same instructions as the world's.
ENVIRONMENT_POLICY_PROMPT = (
    "You work in an environment by calling its tools. The environment: {environment} "
    "Call one tool at a time, read its result, and when the request is done reply with a "
    "short final answer."
)

# --------------------------------------------------------------------------- synthesis roles
# The synthesis roles' system prompts. Dynamic content (the trajectory, the
# exploration log, the candidate) goes in the user message; the slots say the
# environment, the same for a whole run. Filled with str.replace, not str.format, so a
# prompt (or a config's replacement) may hold JSON braces; one without slots is used
# as it is.
ENVIRONMENT_SLOT = "{environment}"

# What the slot says when the roles are built with no environment (a unit test's roles).
NO_ENVIRONMENT = "an executable tool environment; the tools that matter are shown with each request"

# The examples' slots, each filled from the brief's field of that name; an empty field
# (an environment that gives no such example) reads as the neutral phrase here, which
# names no environment's things.
EXAMPLE_DEFAULTS: dict[str, str] = {
    "action_pattern": "lookup_tool > tool_using_its_result",
    "lookups": "the calls that only read",
    "variations": "other values for the arguments",
    "known_values": "the values a person would know",
    "answer_values": "a value an observation shows",
}
EXAMPLE_SLOTS = {name: "{" + name + "}" for name in EXAMPLE_DEFAULTS}

SUMMARIZER_PROMPT = """\
You analyse one rollout of a tool-using agent, for a system that trains the agent on \
tasks synthesized from its own failures.

The agent works in an executable environment: {environment} Each rollout is scored by the \
environment's verifier (1.0 = solved).

The rollout was flagged by one or more signals:
- forgetting: the task or its family used to be solved (score >= 0.5 in recent cycles) \
and now fails; the agent lost a skill it had.
- boundary: among the K rollouts of this task in this cycle some succeeded and some \
failed; the agent is at the edge of its ability here.
- rare: the action pattern of this rollout is rare among everything observed; the \
scenario is under-represented in training.
- unsolved: all K rollouts of this task failed this cycle and it was never solved; the \
agent cannot do it yet, so new tasks should keep its structure or be a step toward it.

When a nearest miss is shown (another failed rollout of the same task that got further), \
the step where it broke is the frontier of the skill: aim the failure_cause there.

Read the task, its reference solution, the rollout (calls and observations) and the \
signal evidence, and write the context an explorer and a task writer will work from:
- summary: two or three sentences: what was asked, what the agent did, how it scored.
- failure_cause: the first step that went wrong and why (wrong tool, wrong or invented \
argument value, value not copied from an earlier observation, error not recovered, \
missing step, wrong final answer). Say so if the rollout did not fail.
- instability_pattern: what the signal evidence says about when the agent fails.
- focus_patterns: the tool names (exact names) and short action patterns \
(e.g. "{action_pattern}") the new tasks should exercise.
- exploration_objectives: one to three concrete goals for an explorer that will act in a \
fresh copy of the environment. forgetting -> reinforce the forgotten skill on varied \
values; rare -> explore the rare scenario and its neighbours; boundary -> explore the \
boundary: variations around the step where rollouts diverge; unsolved -> the task's \
structure on new values, and its first steps on their own.
- failing_step: the 0-based index of the reference call where the rollout (or, when shown, \
the nearest miss) went wrong; the number of reference calls when every call matched but \
the outcome did not; null when unknown.
- do_not_repeat: task instructions new tasks must not duplicate (include the flagged \
task's instruction).

Answer with a JSON object with exactly these fields."""

EXPLORER_PROMPT = """\
You explore a tool environment to discover material for new training tasks for a \
tool-using agent. You act through the bound tools; every call runs for real against a \
fresh copy of the environment and you see its result. Errors are normal results: read \
them and adapt.

The environment: {environment}

Follow the exploration goal you are given. Useful exploration:
- reaches states the goal is about, using lookups ({lookups}) to learn ids \
and values before calls that change state;
- passes values from observations into later calls exactly as they appear;
- tries realistic variations ({variations}), including \
situations where a call fails and must be recovered from;
- makes one tool call at a time and uses each result before the next call.

You have a small budget of calls. When you have explored enough, or the budget is \
spent, stop calling tools and reply with one sentence on what you found."""

ABSTRACTOR_PROMPT = """\
You turn logged interactions with a tool environment into new, verifiable training tasks \
for a tool-using agent.

The environment: {environment}

You get: the context of a flagged failure (summary, failure cause, focus patterns, \
exploration objectives), the tools, exploration rounds as numbered (call -> observation) \
lines, each round starting from the same initial state, and existing tasks that must \
not be repeated.

Propose tasks the agent should learn from this material. Each task has:
- description: one line saying what the task exercises (tools, the value flow, the \
failure it targets).
- query: the user's request, in natural language, as a person would write it. It names \
things by what a person knows ({known_values}), never by internal \
ids, and contains every value the agent needs that cannot be looked up.
- minimal_actions: the shortest sequence of tool calls that fulfils the query, starting \
from the rounds' initial state, each as {"name": "<tool>", "arguments": {...}} with \
literal argument values (ids as they appear in the observations). Include the lookups \
that reveal the ids used later. Only calls that succeeded in the log, or that certainly \
succeed, belong here.
- reference_answer: the exact value the final answer must contain when the query asks \
a question ({answer_values}); null when the query only asks for changes.

Prefer tasks that exercise the focus patterns and the exploration objectives, that \
differ from the tasks to avoid, and that are grounded in what the observations show. \
Answer with a JSON object {"candidates": [...]}."""

JUDGE_PROMPT = """\
You judge whether a synthesized training task for a tool-using agent is valid.

The environment: {environment}

You get the user query, an optional expected answer, and the task's minimal action \
sequence as it was replayed in a fresh environment, with every observation and the \
environment verifier's result.

Check:
- api_match: every call uses a tool that exists and is the right tool for its part of \
the query.
- parameter_usage: argument values are right: taken from the query or from earlier \
observations, nothing invented, nothing missing.
- logical_flow: the calls come in a sensible order, lookups before the calls that use \
their results, and no call is superfluous.
- final_result: executing the actions fulfils the query completely (and the expected \
answer, if any, is what the query asks for and is supported by the observations).
- failed_or_skipped_steps: calls that failed or steps the query needs that are missing.
- success: true only if the task is clear, solvable from the query alone, and the \
actions are a correct solution.
- reason: one or two sentences justifying the verdict.

Answer with a JSON object with exactly these fields."""


def describe_environment(brief: EnvironmentBrief) -> str:
    """The text the ``{environment}`` slot holds: what it is, its tools, how its ids look."""
    parts = [brief.description.strip().rstrip(".") + "."]
    if brief.tools:
        parts.append(f"Its tools: {', '.join(brief.tools)}.")
    if brief.ids:
        parts.append(brief.ids[:1].upper() + brief.ids[1:].rstrip(".") + ".")
    return " ".join(parts)


def examples(brief: EnvironmentBrief | None) -> dict[str, str]:
    """What each example slot says of ``brief``: its own example, else (an action pattern)
    its first tools, else the neutral phrase."""
    said = {name: str(getattr(brief, name, "") or "") for name in EXAMPLE_DEFAULTS}
    if not said["action_pattern"] and brief is not None and brief.tools:
        said["action_pattern"] = " > ".join(brief.tools[:2])
    return {name: text or EXAMPLE_DEFAULTS[name] for name, text in said.items()}


def fill_environment(prompt: str, brief: EnvironmentBrief | None) -> str:
    """``prompt`` with its ``{environment}`` slot saying ``brief`` (None: NO_ENVIRONMENT)
    and each example slot its example (``examples``)."""
    text = describe_environment(brief) if brief is not None else NO_ENVIRONMENT + "."
    filled = prompt.replace(ENVIRONMENT_SLOT, text)
    for name, example in examples(brief).items():
        filled = filled.replace(EXAMPLE_SLOTS[name], example)
    return filled


def policy_system_prompt(configured: str | None, brief: EnvironmentBrief | None) -> str | None:
    """The policy's system prompt: ``configured`` as written where a config gave its own
    (or none); the default on a user's environment (``brief``) in the environment's words,
    ``ENVIRONMENT_POLICY_PROMPT`` filled; on a built-in one (``brief`` None) the default,
    the prompt the world's agents were trained and judged with, byte for byte."""
    if configured != POLICY_SYSTEM_PROMPT or brief is None:
        return configured
    return fill_environment(ENVIRONMENT_POLICY_PROMPT, brief)


def environment_policy_prompt(configured: str | None, env_name: str) -> str | None:
    """``policy_system_prompt`` for the environment a config names: a built-in one (the
    world, BFCL) keeps the default, a user's gets its own words (its brief)."""
    from ..envs.brief import environment_brief
    from ..envs.registry import ENVIRONMENTS, get_environment

    if configured != POLICY_SYSTEM_PROMPT or env_name in ENVIRONMENTS:
        return configured
    brief = environment_brief(get_environment(env_name).environment())
    return policy_system_prompt(configured, brief)


def filled_from(text: str, prompt: str) -> bool:
    """Whether ``text`` is ``prompt`` with its slots filled, whatever environment filled them
    (the scripted test server tells the roles apart by it)."""
    slots = "|".join(re.escape(slot) for slot in (ENVIRONMENT_SLOT, *EXAMPLE_SLOTS.values()))
    pieces = re.split(slots, prompt)
    pattern = "(?:.*?)".join(re.escape(piece) for piece in pieces)
    return re.fullmatch(pattern, text, flags=re.DOTALL) is not None
