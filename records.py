"""The records that flow between the parts of coevolve.

Every record is a pydantic model, so it validates on the way in and survives a
JSON round-trip unchanged (``Model.model_validate_json(x.model_dump_json())``).
Tool-call arguments stay plain dicts here; datasets serialise them as JSON
strings (Arrow would merge differently-keyed dicts into null-filled structs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict

# "random" marks trajectories picked at random instead of by a detector (the
# control arm of the learning ablation, coevolve bench learning); "oracle" marks
# trajectories of the families the agent fails on the validation split (the
# ablation's reference ceiling: it reads validation, so it is never a product arm).
SignalKind = Literal["forgetting", "boundary", "rare", "unsolved", "random", "oracle"]
# The detectors: the paper's three, and unsolved (every rollout of a task failed, never solved).
SIGNAL_KINDS: tuple[SignalKind, ...] = ("forgetting", "boundary", "rare", "unsolved")
PAPER_SIGNAL_KINDS: tuple[SignalKind, ...] = ("forgetting", "boundary", "rare")

# How a model wrote a tool call the policy read: the server's ``tool_calls`` field, a
# ``<tool_call>`` tag in the text, a JSON object ``{"name", "arguments"}`` alone or in a
# fenced block, or a line of call syntax (``find_contact(name="Ana")``).
CallForm = Literal["tool_calls_field", "tool_call_tag", "bare_json", "fenced_json", "call_line"]
CALL_FORMS: tuple[CallForm, ...] = (
    "tool_calls_field",
    "tool_call_tag",
    "bare_json",
    "fenced_json",
    "call_line",
)

# A score this high is a success (the paper's reward 1); the margin absorbs float
# rounding in verifiers that add up fractions.
SUCCESS_SCORE = 1.0 - 1e-9


def is_success(score: float) -> bool:
    """Whether a verifier score (or an execution reward) counts as a solved task."""
    return score >= SUCCESS_SCORE


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolCall(Record):
    """One call of a tool: a name and literal (JSON-representable) arguments."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = Field(default=None, description="Call id as the model or server gave it.")


class Observation(Record):
    """What the environment answered to one tool call.

    ``error`` is a short machine-readable kind ("unknown_tool", "bad_arguments",
    "not_found", "insufficient_balance", ...) when the call failed; the text then
    explains it to the agent. Errors are observations, never exceptions.
    """

    text: str
    error: str | None = None


class Turn(Record):
    """One user message of a task and the calls that correctly answer it."""

    query: str
    reference_calls: list[ToolCall] = Field(default_factory=list)
    # BFCL "miss_func": tools that become available only from this turn on.
    added_tools: list[str] = Field(default_factory=list)


class Task(Record):
    """A task an agent can be rolled out on, with its reference solution.

    ``setup`` holds the environment-specific initial state (the built-in world
    stores the whole state; BFCL stores its initial_config and classes), so a
    task is self-contained and replayable without the generator that made it.
    """

    id: str
    env: str
    family: str = Field(description="Task family (world) or category (BFCL).")
    split: str = "train"
    turns: list[Turn] = Field(min_length=1)
    reference_answer: str | None = Field(
        default=None, description="Text the final answer must contain, if the task asks a question."
    )
    setup: dict[str, Any] = Field(default_factory=dict)
    # Provenance: filled for synthesized tasks.
    source: Literal["seed", "synthesized"] = "seed"
    parent_task_id: str | None = None
    signal: SignalKind | None = None
    cycle: int | None = None

    @property
    def instruction(self) -> str:
        return self.turns[0].query

    @property
    def reference_calls(self) -> list[ToolCall]:
        return [call for turn in self.turns for call in turn.reference_calls]


class Step(Record):
    """One assistant action and what came back."""

    turn: int = 0
    call: ToolCall | None = Field(
        default=None, description="None when the model's text did not parse."
    )
    raw: str | None = Field(default=None, description="Model text the call was parsed from.")
    call_form: CallForm | None = Field(
        default=None,
        description="How the model wrote the call (CALL_FORMS); None for a call that did not "
        "parse, or one no reply was read for (the oracle, a replay).",
    )
    observation: Observation


class ModelTurn(Record):
    """One assistant message as token ids: what the model read and exactly what it wrote.

    The prompt is stored as a delta: ``prompt_shared`` leading ids equal the previous
    turn's prompt followed by its completion, then ``prompt_new_ids`` (the tool results
    and the next generation prompt); a first turn shares nothing. ``TokenSequence``
    rebuilds whole prompts and the training rows.
    """

    message_index: int = Field(description="Index of the assistant message in the trajectory.")
    prompt_shared: int = Field(
        default=0, ge=0, description="Leading prompt ids shared with the previous turn's ids."
    )
    prompt_new_ids: list[int] = Field(
        default_factory=list, description="The prompt's ids after the shared ones."
    )
    completion_ids: list[int] = Field(
        description="The generated ids, the end-of-turn token included when it stopped."
    )
    logprobs: list[float] | None = Field(
        default=None, description="Log-probability of each completion id under the model."
    )


class Trajectory(Record):
    """One rollout of a policy on a task, scored by the environment's verifier."""

    id: str
    task_id: str
    env: str
    family: str
    messages: list[dict[str, Any]] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    final_answer: str | None = None
    score: float = Field(ge=0.0, le=1.0)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    policy_version: str = "unknown"
    rollout_index: int = 0
    cycle: int = 0
    finished: bool = Field(
        default=True, description="False when the step limit or an error cut it off."
    )
    error: str | None = Field(
        default=None,
        description="Why the episode stopped early (e.g. the endpoint failed after retries).",
    )
    transport_failure: bool = Field(
        default=False,
        description="The episode ended because the endpoint gave no usable reply (connection "
        "refused or dropped, timeout, 5xx or an unreadable body after every retry): not the "
        "agent's outcome, so the loop leaves it out of signals, history, training and rates.",
    )
    diagnosis: list[str] = Field(
        default_factory=list,
        description="SEAL failure labels, one per BFCL user turn or per world step plus one "
        "outcome label (coevolve.envs.diagnosis); empty when not diagnosed.",
    )
    progress: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Graded progress beside the binary score (passed turns / scorable turns on "
        "BFCL, achieved expected state changes on the world); None when not computed.",
    )
    failure_grade: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="How close the episode came to success, as the Co-Evolving Agents step ranks "
        "failures: progress on BFCL; on the world, progress with the reference's calls made in "
        "order counted as units too (coevolve.envs.world.world_diagnosis.world_progress); None "
        "when not computed.",
    )
    model_turns: list[ModelTurn] = Field(
        default_factory=list,
        description="Every assistant message as the token ids the model read and wrote, when "
        "the policy gives them (in-process always; an endpoint with return_token_ids); "
        "training uses these ids rather than re-tokenising the messages.",
    )

    @property
    def calls(self) -> list[ToolCall]:
        return [step.call for step in self.steps if step.call is not None]


def split_transport_failures(
    trajectories: Sequence[Trajectory],
) -> tuple[list[Trajectory], list[Trajectory]]:
    """The episodes that ran (the agent's outcomes), and those the endpoint gave no usable
    reply for (``transport_failure``), which no figure, signal or training set may count."""
    ran = [t for t in trajectories if not t.transport_failure]
    lost = [t for t in trajectories if t.transport_failure]
    return ran, lost


class Signal(Record):
    """Why a trajectory was flagged as failure-prone, with the evidence."""

    kind: SignalKind
    trajectory_id: str
    task_id: str
    family: str
    cycle: int = 0
    evidence: dict[str, Any] = Field(
        default_factory=dict, description="Scores, window, counts: whatever made it fire."
    )


class FlaggedTrajectory(Record):
    """A trajectory with every signal that flagged it."""

    trajectory: Trajectory
    signals: list[Signal]
    nearest_miss: Trajectory | None = Field(
        default=None,
        description="Another failed episode of the same task that got further (higher graded "
        "progress): a hard negative the summarizer reads beside the flagged one "
        "(attach_nearest_misses).",
    )

    @property
    def kinds(self) -> list[SignalKind]:
        return [s.kind for s in self.signals]


class PoolSample(Record):
    """What a cycle's training step demonstrates besides its rollouts (the update_pool
    stage's output): the tasks its synthesis added to the pool and earlier pool tasks
    replayed (``pool.replay_demonstrations``)."""

    accepted: list[Task] = Field(description="The cycle's accepted synthesized tasks.")
    replay: list[Task] = Field(description="Earlier pool tasks whose demonstrations replay.")


class SynthesisContext(Record):
    """The summarizer's signal-conditioned reading of a flagged trajectory."""

    summary: str
    failure_cause: str = ""
    instability_pattern: str = ""
    focus_patterns: list[str] = Field(default_factory=list)
    exploration_objectives: list[str] = Field(default_factory=list)
    do_not_repeat: list[str] = Field(default_factory=list)
    failing_step: int | None = Field(
        default=None,
        description="0-based index of the reference call where the rollout went wrong (a "
        "wrong tool, a value not copied, a missing step); len(reference) when every call "
        "matched but the outcome (e.g. the answer) did not; None when unknown.",
    )


class CandidateTask(Record):
    """A task proposed by the task-abstractor, not yet validated."""

    description: str
    query: str
    minimal_actions: list[ToolCall] = Field(min_length=1)
    reference_answer: str | None = None
    parent_task_id: str | None = None
    signal: SignalKind | None = None
    setup: dict[str, Any] = Field(default_factory=dict)
    kind: Literal["structure_variant", "prefix", "transition", "window", "llm", "variation"] = (
        Field(
            default="window",
            description="How it was made: structure_variant (the environment's generator: the "
            "parent's whole tool graph on new values and state), prefix (the first calls of that "
            "graph, a step toward it), transition (the failing call and the one before it, on their "
            "own), window (an explored action window: a sub-skill or composition), llm (an LLM "
            "abstractor), variation (the parent's calls and request with new values, no generator).",
        )
    )


class Neighbour(Record):
    """A stored task near a query: shown to the abstractor as 'do not repeat'."""

    id: str
    text: str
    similarity: float
    task: Task | None = Field(default=None, description="None if stored without its JSON.")


class Verdict(Record):
    """The judge's decision on a candidate task."""

    success: bool
    reason: str
    api_match: bool | None = None
    parameter_usage: bool | None = None
    logical_flow: bool | None = None
    final_result: bool | None = None
    failed_or_skipped_steps: list[str] = Field(default_factory=list)
    execution_reward: float | None = Field(default=None, ge=0.0, le=1.0)

    @property
    def accepted(self) -> bool:
        """The paper's rule: judged successful, or the environment still rewarded it."""
        return self.success or (self.execution_reward is not None and self.execution_reward > 0)

    @property
    def vetoed_accepted(self) -> bool:
        """The strict rule: the replay verifies (reward 1.0) and the judge agrees.

        With the executable judge the two coincide; with an LLM judge its "no"
        rejects a candidate whatever the replay scored.
        """
        return (
            self.success and self.execution_reward is not None and is_success(self.execution_reward)
        )

    def is_accepted(self, judge_veto: bool) -> bool:
        return self.vetoed_accepted if judge_veto else self.accepted


# --------------------------------------------------------------------------- the train stage

Algorithm = Literal["sft", "grpo", "dpo"]


class GroupFigures(Record):
    """GRPO: the reward spread of the generation rounds' groups (means over rounds)."""

    without_reward_spread: float | None = Field(
        default=None, description="Share of groups whose rewards were all equal (TRL's count)."
    )
    with_spread: float | None = Field(
        default=None,
        description="Dynamic sampling: share of a round's first groups with both successes and "
        "failures.",
    )
    dropped: float | None = Field(
        default=None, description="Dynamic sampling: groups without spread dropped per round."
    )
    refilled: float | None = Field(
        default=None, description="Dynamic sampling: groups of further prompts drawn per round."
    )
    final_with_spread: float | None = Field(
        default=None, description="Dynamic sampling: share of the trained groups with spread."
    )
    all_failed: float | None = Field(
        default=None,
        description="Reference episodes: share of a round's groups whose episodes all failed.",
    )
    given_reference: float | None = Field(
        default=None,
        description="Reference episodes: share of a round's groups given the task's reference "
        "episode in place of one of theirs.",
    )


class TrainResult(Record):
    """What one training step did; also stored as ``training.json`` in the adapter directory."""

    algorithm: Algorithm
    adapter_dir: str | None = Field(
        description="The new adapter; when skipped, the previous adapter (or None)."
    )
    previous_adapter: str | None = None
    steps: int = 0
    examples: int = Field(
        default=0, description="Conversations (sft), pairs (dpo) or tasks (grpo) trained on."
    )
    final_loss: float | None = None
    mean_loss: float | None = None
    mean_reward: float | None = Field(default=None, description="GRPO: mean episode reward.")
    groups: GroupFigures | None = Field(
        default=None, description="GRPO: the reward spread of its groups."
    )
    demonstration_steps: int | None = Field(
        default=None,
        description="GRPO: of steps, SFT steps on the demonstrations of tasks no rollout solved.",
    )
    train_time_s: float = 0.0
    steps_per_s: float | None = None
    device: str | None = None
    world_size: int = Field(
        default=1, ge=1, description="Training processes that took part (DDP world size)."
    )
    skipped: str | None = Field(
        default=None, description="Why nothing was trained (no data); None when trained."
    )
    resumed_from_step: int | None = Field(
        default=None,
        description="training.checkpoint_every: the step of the checkpoint a killed step "
        "continued from; None when it ran from step 0.",
    )
    rows_by_source: dict[str, int] = Field(
        default_factory=dict,
        description="The rows of the cycle's train_data.jsonl by their source (TRAINING_SOURCES: "
        "seed and synthesized tasks' reference demonstrations, or GRPO prompts of them; rollout "
        "successes and preference pairs); empty for hard negatives and steps recorded before.",
    )


class AgentShare(TypedDict):
    """One agent's episodes and how many of their failures are hard negatives."""

    episodes: int
    success: float | None  # share of episodes that succeeded
    failures: int
    hard: int  # failures graded at or above the threshold
    share: float | None  # hard / failures
    mean_failure_grade: float | None


class HardNegativeFigures(TypedDict):
    """A hard-negative cycle's figures (``hard_negatives.json``, the summary's
    ``train.hard_negatives``)."""

    threshold: float
    target: AgentShare
    failure_agent: AgentShare | None  # None without a failure agent
    failure_pairs: int
    failure_pairs_hard: int
    failure_pairs_with_success: int
    target_pairs: int
    target_pairs_hard: int
    target_pairs_by_source: dict[str, int]
    experts: int
    failure_rollout_time_s: float
    failure_train_time_s: float
    failure_time_s: float
