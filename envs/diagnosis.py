"""SEAL's turn-level failure diagnosis and the graded progress score, for both environments.

SEAL (arXiv 2605.24426, code github.com/yihaohu0118/SEAL) labels every
trajectory with a deterministic, rule-based classifier; no LLM is involved. The
labels weight the GRPO advantage (``coevolve.training.seal``) and choose the
training-only interface hints (``coevolve.envs.adaptation``).

**BFCL** (``diagnose_bfcl``): one label per *ground-truth user turn*, SEAL's
released procedure (``multi_turn_progress.compute_per_turn_progress``). For each
turn, without stopping at the first failure:

1. the model's calls of the turn run on the model's copy of the state, then the
   ground-truth calls on the ground-truth copy (both with BFCL's own
   ``execute_multi_turn_func_call``, state carried over between turns); if the
   ground truth raises: ``gt_error``;
2. ground-truth turn empty (an irrelevance turn): ``spurious_tool_call`` if the
   model emitted any decodable call, else ``correct_abstention``;
3. no decodable call on a turn that needs calls: ``empty_turn_model_response``;
4. the instance classes the model's execution produced differ from the ground
   truth's: ``instance_mismatch``. Here that happens when every call of the
   turn was refused before execution (unknown or not-yet-available tool,
   arguments failing the schema), so no instance ran: SEAL's environment refuses
   unavailable tools the same way (``enforce_available_tools``);
5. BFCL's ``state_checker`` fails: ``state_mismatch`` (raises: ``checker_error``);
6. BFCL's ``response_checker`` on all model results so far against this turn's
   ground-truth results fails: ``response_mismatch`` (raises: ``checker_error``);
7. otherwise ``pass``.

Turns the episode never reached count as turns without calls (SEAL pads them
with empty lists). ``progress = passed turns / scorable turns``, where scorable
turns are the turns with ground-truth calls and a label outside
``EXCLUDED_LABELS`` (our reading of SEAL's ``progress``; irrelevance turns count
in ``progress_with_irrelevance`` instead).

**The world** (``diagnose_world``, in ``envs/world/world_diagnosis.py``) has one user
turn and several tool steps, so it gets one label per model step plus one outcome label
at the end. A step gets the first label that applies, in this priority order (the
paper's Table 5 order, invalid > argument > ... > response, with SEAL's code labels
where they exist):

===========================  =====================================================
``invalid_tool_call``        text that did not parse, or an unknown tool
``argument_mismatch``        ``bad_arguments`` (schema) or ``invalid_value`` (domain check)
``recovery_failure``         any other error (``not_found``, ``insufficient_balance``, ...)
                             not followed by a successful call of the same tool, unless
                             the reference makes the very same call (an error the task
                             plans for, e.g. looking up a contact that does not exist yet)
``instance_mismatch``        a successful call of an app (contacts, shop, ...) the
                             reference solution never uses
``state_mismatch``           a successful call that changed a part of the state the
                             reference never changes (the wrong item, a stray write)
``pass``                     anything else (including an error later recovered from)
===========================  =====================================================

The outcome label: ``spurious_tool_call`` / ``correct_abstention`` when the
reference makes no call; ``empty_turn_model_response`` when the model made no
call but had to; ``state_mismatch`` when the final state differs from the
reference's; ``response_mismatch`` when the state is right but the answer is
wrong; else ``pass``. So a trajectory scores 1 exactly when its outcome label is
``pass`` or ``correct_abstention``.

The world's graded progress (``world_progress``) is the fraction of expected
state changes achieved: every item (or scalar) the reference solution changes,
plus the answer when the task asks a question, is one unit; a unit is achieved
when the final state has the reference's value there. Items the model changed
that the reference leaves alone are extra units never achieved, so progress is
1.0 exactly when the verifier's score is 1.0.

Given the episode's calls, ``world_progress`` also counts every call of the
reference solution as a unit, achieved when the episode made the same call
(name and arguments) in the same order (a longest common subsequence, so a
wrong call in between does not undo the calls around it); an episode whose
state changes and answer are all right still scores 1.0 whatever calls it took.
That is the world's ``failure_grade``, what the Co-Evolving Agents step ranks
failures by: most world families make their one state change at their last
call, so counted by state changes alone nearly every failure scores 0
(measured on SmolLM2's rollouts: mean 0.015, every failure pair a tie) and
nothing is ranked. With the calls, "looked up the contact, then texted the
wrong number" grades above "called nothing useful".
"""

from __future__ import annotations

import importlib
import json
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..records import Step, Task, ToolCall, Trajectory
from .base import answer_matches

# ---------------------------------------------------------------------------- labels

PASS = "pass"
SPURIOUS_TOOL_CALL = "spurious_tool_call"
CORRECT_ABSTENTION = "correct_abstention"
EMPTY_TURN = "empty_turn_model_response"
INSTANCE_MISMATCH = "instance_mismatch"
STATE_MISMATCH = "state_mismatch"
RESPONSE_MISMATCH = "response_mismatch"
CHECKER_ERROR = "checker_error"
GT_ERROR = "gt_error"
# The world's step labels that SEAL's code does not emit (the paper's Table 5 names).
INVALID_TOOL_CALL = "invalid_tool_call"
ARGUMENT_MISMATCH = "argument_mismatch"
RECOVERY_FAILURE = "recovery_failure"

BFCL_LABELS = (
    SPURIOUS_TOOL_CALL,
    CORRECT_ABSTENTION,
    EMPTY_TURN,
    INSTANCE_MISMATCH,
    STATE_MISMATCH,
    RESPONSE_MISMATCH,
    PASS,
    CHECKER_ERROR,
    GT_ERROR,
)
WORLD_LABELS = (
    INVALID_TOOL_CALL,
    ARGUMENT_MISMATCH,
    RECOVERY_FAILURE,
    INSTANCE_MISMATCH,
    STATE_MISMATCH,
    SPURIOUS_TOOL_CALL,
    CORRECT_ABSTENTION,
    EMPTY_TURN,
    RESPONSE_MISMATCH,
    PASS,
)
ALL_LABELS = tuple(dict.fromkeys(BFCL_LABELS + WORLD_LABELS))
# Left out of the weights (numerator and denominator) and of the progress denominator.
EXCLUDED_LABELS = frozenset({CHECKER_ERROR, GT_ERROR})
DIAGNOSIS_VERSION = 1

# Error kinds the dispatcher gives before a call reaches a tool: the call never ran.
NOT_EXECUTED_ERRORS = frozenset({"parse_error", "unknown_tool", "bad_arguments", "episode_over"})
_INVALID_CALL_ERRORS = frozenset({"parse_error", "unknown_tool", "episode_over"})
_ARGUMENT_ERRORS = frozenset({"bad_arguments", "invalid_value"})


def count_labels(trajectories: Sequence[Trajectory]) -> dict[str, int]:
    """Label counts over trajectories, most frequent first (for metrics and the report)."""
    counts = Counter(label for trajectory in trajectories for label in trajectory.diagnosis)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


# ---------------------------------------------------------------------------- BFCL


@dataclass
class ModelTurn:
    """What the model did in one user turn, as the BFCL diagnosis needs it."""

    emitted: bool = False  # at least one decodable tool call
    executed: list[str] = field(default_factory=list)  # BFCL call strings that reached a tool


@dataclass
class BfclDiagnosis:
    labels: list[str]
    progress: float
    progress_with_irrelevance: float


def bfcl_model_turns(task: Task, steps: Sequence[Step]) -> list[ModelTurn]:
    """The model's turns from recorded steps; turns never reached are empty (SEAL's padding)."""
    from .base import ToolError
    from .bfcl_checking import bfcl_call_string

    turns = [ModelTurn() for _ in task.turns]
    for step in steps:
        if step.call is None or not 0 <= step.turn < len(turns):
            continue
        turn = turns[step.turn]
        turn.emitted = True
        if step.observation.error in NOT_EXECUTED_ERRORS:
            continue
        try:
            turn.executed.append(bfcl_call_string(step.call))
        except ToolError:  # refused before recording, as BfclEnvironment._execute does
            continue
    return turns


def diagnose_bfcl(task: Task, model_turns: Sequence[ModelTurn]) -> BfclDiagnosis:
    """SEAL's per-ground-truth-turn labels (module docstring) and the progress score."""
    from .bfcl_checking import forget_checker_instances, ground_truth_strings, require_bfcl

    require_bfcl()
    checker = importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")
    utils = importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")
    setup = task.setup
    ground_truth = ground_truth_strings(task)
    entry_id = str(setup.get("entry_id", task.id))
    options = {
        "initial_config": setup.get("initial_config", {}),
        "involved_classes": list(setup["involved_classes"]),
        "test_entry_id": entry_id,
        "long_context": bool(setup.get("long_context", False)),
        "is_evaL_run": True,
    }
    model_name = f"coevolve_diag_{uuid.uuid4().hex}"
    labels: list[str] = []
    all_model_results: list[str] = []
    turns = list(model_turns) + [ModelTurn() for _ in range(len(ground_truth) - len(model_turns))]
    try:
        for index, gt_calls in enumerate(ground_truth):
            turn = turns[index]
            model_instances: dict[str, Any] = {}
            if turn.executed:
                results, model_instances = utils.execute_multi_turn_func_call(
                    func_call_list=list(turn.executed), model_name=model_name, **options
                )
                all_model_results.extend(results)
            try:
                gt_results, gt_instances = utils.execute_multi_turn_func_call(
                    func_call_list=list(gt_calls),
                    model_name=model_name + "_ground_truth",
                    **options,
                )
            except Exception:  # boundary: only BFCL's code on task data runs here (SEAL's gt_error)
                labels.append(GT_ERROR)
                continue
            labels.append(
                _bfcl_turn_label(
                    checker, index, gt_calls, turn, model_instances, gt_instances, gt_results,
                    all_model_results,
                )
            )  # fmt: skip
    finally:
        forget_checker_instances(model_name)
    scorable = [
        label for label, gt in zip(labels, ground_truth, strict=True)
        if gt and label not in EXCLUDED_LABELS
    ]  # fmt: skip
    counted = [label for label in labels if label not in EXCLUDED_LABELS]
    passed = sum(label == PASS for label in scorable)
    relevant = sum(label in (PASS, CORRECT_ABSTENTION) for label in counted)
    return BfclDiagnosis(
        labels=labels,
        progress=passed / len(scorable) if scorable else 0.0,
        progress_with_irrelevance=relevant / len(counted) if counted else 0.0,
    )


def _bfcl_turn_label(
    checker: Any,
    index: int,
    gt_calls: Sequence[str],
    turn: ModelTurn,
    model_instances: Mapping[str, Any],
    gt_instances: Mapping[str, Any],
    gt_results: list[str],
    all_model_results: list[str],
) -> str:
    if not gt_calls:
        return SPURIOUS_TOOL_CALL if turn.emitted else CORRECT_ABSTENTION
    if not turn.emitted:
        return EMPTY_TURN
    if set(model_instances) != set(gt_instances):
        return INSTANCE_MISMATCH
    try:
        if not checker.state_checker(model_instances, gt_instances)["valid"]:
            return STATE_MISMATCH
        if not checker.response_checker(list(all_model_results), gt_results, index)["valid"]:
            return RESPONSE_MISMATCH
    except Exception:  # boundary: only BFCL's checkers run here (SEAL's checker_error)
        return CHECKER_ERROR
    return PASS


# ---------------------------------------------------------------------------- world


def _flatten(view: Mapping[str, Any]) -> dict[tuple[str, ...], Any]:
    """A comparable world state as units: one per item of a collection, one per scalar."""
    units: dict[tuple[str, ...], Any] = {}
    for key, value in view.items():
        if isinstance(value, dict):
            for item, sub in value.items():
                units[(key, str(item))] = sub
        else:
            units[(key,)] = value
    return units


def _changed(before: Mapping[tuple[str, ...], Any], after: Mapping[tuple[str, ...], Any]) -> set:
    return {unit for unit in before.keys() | after.keys() if before.get(unit) != after.get(unit)}


def _common_calls(reference: Sequence[ToolCall], made: Sequence[ToolCall]) -> int:
    """How many reference calls ``made`` repeats in order (longest common subsequence)."""
    wanted = [(call.name, _key(call.arguments)) for call in reference]
    lengths = [0] * (len(wanted) + 1)
    for call in made:
        key = (call.name, _key(call.arguments))
        previous_diagonal = 0
        for i, reference_key in enumerate(wanted):
            above = lengths[i + 1]
            if key == reference_key:
                lengths[i + 1] = previous_diagonal + 1
            else:
                lengths[i + 1] = max(above, lengths[i])
            previous_diagonal = above
    return lengths[-1]


def graded_progress(
    task: Task,
    start: Mapping[tuple[str, ...], Any],
    expected: Mapping[tuple[str, ...], Any],
    final: Mapping[tuple[str, ...], Any],
    answer: str | None,
    calls: Sequence[ToolCall] | None,
) -> float:
    """``world_progress`` from flattened states (also a user environment's progress): the
    units ``expected`` changes from ``start``, plus the ones ``final`` changes wrongly."""
    wanted = _changed(start, expected)
    extra = {
        unit for unit in _changed(start, final) - wanted if final.get(unit) != expected.get(unit)
    }
    achieved = sum(final.get(unit) == expected.get(unit) for unit in wanted)
    total = len(wanted) + len(extra)
    if task.reference_answer is not None:
        total += 1
        achieved += answer_matches(answer, task.reference_answer)
    if achieved == total:  # the outcome is right (the verifier's 1.0), however it got there
        return 1.0
    if calls is not None:
        achieved += _common_calls(task.reference_calls, calls)
        total += len(task.reference_calls)
    return achieved / total


def step_error_label(
    step: Step,
    later: Sequence[Step],
    planned: set[tuple[str, str]],
    invalid: frozenset[str] = _INVALID_CALL_ERRORS,
) -> str | None:
    """The label of a step that failed (module docstring); None for one that succeeded.
    ``planned``: the reference's calls as (name, ``_key(arguments)``)."""
    error = step.observation.error
    if step.call is None or error in invalid:
        return INVALID_TOOL_CALL
    if error in _ARGUMENT_ERRORS:
        return ARGUMENT_MISMATCH
    if error is None:
        return None
    name = step.call.name
    recovered = any(
        s.call is not None and s.call.name == name and s.observation.error is None for s in later
    )
    return PASS if (name, _key(step.call.arguments)) in planned or recovered else RECOVERY_FAILURE


def outcome_label(task: Task, steps: Sequence[Step], answer: str | None, state_right: bool) -> str:
    """The outcome label (module docstring); ``state_right``: the final state is the reference's."""
    if not task.reference_calls:
        return SPURIOUS_TOOL_CALL if any(s.call is not None for s in steps) else CORRECT_ABSTENTION
    if not any(step.call is not None for step in steps):
        return EMPTY_TURN
    if not state_right:
        return STATE_MISMATCH
    if task.reference_answer is not None and not answer_matches(answer, task.reference_answer):
        return RESPONSE_MISMATCH
    return PASS


def _key(arguments: Mapping[str, Any]) -> str:
    return json.dumps(arguments, sort_keys=True, default=str)
