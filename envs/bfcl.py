"""BFCL multi-turn as a coevolve environment.

The ``bfcl-eval`` package ships the data, the stateful tool classes (a file
system, a trading bot, a travel agency, ...) and the official checker. We use
all three, with one difference in how calls run: BFCL's own helper builds
``instance.method(...)`` strings and ``eval``s them, with instances cached in
module globals keyed by model name. Here model output goes through our parser
(literal arguments only), only known tool names are dispatched, and calls run on
instances this environment owns. Each executed call is also recorded as a
``name(key=literal, ...)`` string built from the validated name and the literal
values, which is what the official ``multi_turn_checker`` re-executes at score
time; it runs under a fresh model name per episode whose cache entries are
deleted afterwards, so memory does not grow over a training run.

``bfcl_eval`` is imported inside functions only: ``import coevolve.envs.bfcl``
works without it, and using it without it raises BfclNotInstalledError.
Importing it, call strings, ground-truth strings and the checker's instance cache
live in ``coevolve.envs.bfcl_checking`` (shared with ``coevolve.envs.diagnosis``);
they are re-exported here. The tool classes and their schemas come from
``coevolve.envs.bfcl_tools``.
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
import uuid
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from ..common.files import read_jsonl
from ..records import Observation, Step, Task, ToolCall, Trajectory, Turn
from .base import ToolEnvironment, ToolError
from .bfcl_checking import (
    BFCL_VERSION,
    INSTALL_COMMAND,
    BfclNotInstalledError,
    bfcl_call_string,
    forget_checker_instances,
    ground_truth_strings,
    require_bfcl,
)
from .bfcl_tools import (
    additional_function_prompt,
    class_methods,
    class_schemas,
    data_dir,
    tool_class,
)
from .brief import EnvironmentBrief
from .parsing import ToolCallParseError, parse_tool_calls

__all__ = [
    "ALL_CATEGORIES",
    "BFCL_VERSION",
    "CATEGORIES",
    "INSTALL_COMMAND",
    "SPLITS",
    "BfclEnvironment",
    "BfclNotInstalledError",
    "bfcl_call_string",
    "load_tasks",
    "require_bfcl",
    "split_of",
]

CATEGORIES = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
# The four together, as SEAL trains and tests (100 + 100 of each category).
ALL_CATEGORIES = "multi_turn"
# train and heldout: SEAL's halves of each category (split_of); all: the whole category.
SPLITS = ("train", "heldout", "all")


# --------------------------------------------------------------------------- tasks


# SEAL's published split (envs/data/README.md): its train and test halves of every category.
SEAL_SPLIT_FILE = Path(__file__).resolve().parent / "data" / "bfcl_400_split.json"


@cache
def _seal_split() -> dict[str, str]:
    published = json.loads(SEAL_SPLIT_FILE.read_text())
    return {
        **{entry_id: "train" for entry_id in published["train"]},
        **{entry_id: "heldout" for entry_id in published["test"]},
    }


def split_of(entry_ids: Sequence[str]) -> dict[str, str]:
    """ "train" or "heldout" for each of a category's entry ids: SEAL's split.

    SEAL trains on 100 and evaluates on the other 100 of each multi-turn category;
    its published ``bfcl_400_split.json`` ships in ``envs/data`` (Apache-2.0), so
    a run here trains and evaluates on exactly SEAL's tasks. An id the file does
    not list (a newer bfcl-eval) is an error: it says which.
    """
    split = _seal_split()
    unknown = [entry_id for entry_id in entry_ids if entry_id not in split]
    if unknown:
        raise ValueError(
            f"{len(unknown)} BFCL ids are not in SEAL's split ({SEAL_SPLIT_FILE.name}), e.g. "
            f"{unknown[0]!r}: this bfcl-eval has other tasks than SEAL's"
        )
    return {entry_id: split[entry_id] for entry_id in entry_ids}


def load_tasks(category: str, limit: int | None = None, split: str = "all") -> list[Task]:
    """The category's BFCL entries as Tasks, reference calls parsed by our parser.

    ``split``: "train" or "heldout" (SEAL's halves of the category, ``split_of``), or
    "all" (the whole category, as BFCL's own leaderboard scores it). ``setup``
    keeps everything reset and the checker need, including BFCL's ground-truth
    strings verbatim, so a task is replayable on its own. ``category``
    ``multi_turn`` (``ALL_CATEGORIES``) is the four categories in order, each
    task still labelled with its own.
    """
    if category == ALL_CATEGORIES:
        every = [task for name in CATEGORIES for task in load_tasks(name, split=split)]
        return every[:limit] if limit is not None else every
    if category not in CATEGORIES:
        raise ValueError(
            f"unknown BFCL category {category!r}; choose one of "
            f"{', '.join(CATEGORIES)} or {ALL_CATEGORIES} (all four)"
        )
    if split not in SPLITS:
        raise ValueError(f"unknown BFCL split {split!r}; choose one of {', '.join(SPLITS)}")
    folder = data_dir()
    entries = read_jsonl(folder / f"BFCL_v4_{category}.json")
    if split != "all":
        halves = split_of([entry["id"] for entry in entries])
        entries = [entry for entry in entries if halves[entry["id"]] == split]
    answers = {
        item["id"]: item["ground_truth"]
        for item in read_jsonl(folder / "possible_answer" / f"BFCL_v4_{category}.json")
    }
    if limit is not None:
        entries = entries[:limit]
    return [_task_from_entry(entry, answers[entry["id"]], category) for entry in entries]


def _task_from_entry(entry: dict[str, Any], ground_truth: list[list[str]], category: str) -> Task:
    classes: list[str] = entry["involved_classes"]
    # Later classes win a name clash, as in BFCL's dispatch.
    signatures = {
        name: inspect.signature(getattr(tool_class(class_name), name))
        for class_name in classes
        for name in class_methods(class_name)
    }
    missed: dict[str, list[str]] = entry.get("missed_function", {})
    if len(entry["question"]) != len(ground_truth):
        raise ValueError(
            f"{entry['id']}: {len(entry['question'])} turns but {len(ground_truth)} answers"
        )
    reference = [
        [_parse_reference(source, signatures) for source in calls] for calls in ground_truth
    ]
    added = _added_tools(missed, reference)
    turns = []
    for index, messages in enumerate(entry["question"]):
        query = "\n".join(m["content"] for m in messages if m.get("role") == "user")
        if str(index) in missed and not query:
            # BFCL's own message for the turn that only brings the held-out tools.
            query = additional_function_prompt()
        turns.append(Turn(query=query, reference_calls=reference[index], added_tools=added[index]))
    setup = {
        "entry_id": entry["id"],
        "category": category,
        "initial_config": entry.get("initial_config", {}),
        "involved_classes": classes,
        # The same rule BFCL's executor and checker apply to the entry id.
        "long_context": _is_long_context(entry["id"]),
        "path": entry.get("path", []),
        "excluded_function": entry.get("excluded_function", []),
        "ground_truth": ground_truth,
    }
    return Task(
        id=entry["id"], env="bfcl", family=category, split=category, turns=turns, setup=setup
    )


def _added_tools(
    missed: Mapping[str, Sequence[str]], reference: Sequence[Sequence[ToolCall]]
) -> list[list[str]]:
    """Per turn, the held-out tools that become available then.

    A tool arrives at its ``missed_function`` turn, or earlier if the ground
    truth already calls it: multi_turn_miss_func_49 holds out ``tail`` until
    turn 3 but calls it in turn 1. BFCL's executor runs any method whether or
    not its doc was shown, so that entry passes there; here only advertised
    tools run, so the tool is advertised from its first use.
    """
    arrival = {name: int(turn) for turn, names in missed.items() for name in names}
    for index, calls in enumerate(reference):
        for call in calls:
            if arrival.get(call.name, -1) > index:
                arrival[call.name] = index
    added: list[list[str]] = [[] for _ in reference]
    for name, turn in arrival.items():
        added[turn].append(name)
    return added


def _is_long_context(entry_id: str) -> bool:
    category = entry_id.rsplit("_", 1)[0]
    return "long_context" in category or "composite" in category


def _parse_reference(source: str, signatures: Mapping[str, inspect.Signature]) -> ToolCall:
    """Parse a ground-truth call; positional arguments get their parameter names.

    About 40 ground-truth calls per category are positional (``cd('archives')``),
    which our parser rejects on purpose, so they are named from the method's
    signature first, exactly as Python would bind them.
    """
    node = ast.parse(source, mode="eval").body
    if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Name):
        params = list(signatures[node.func.id].parameters)[1:]  # drop self
        if len(node.args) > len(params):
            raise ValueError(f"too many positional arguments in ground truth {source!r}")
        named = [
            ast.keyword(arg=name, value=arg) for name, arg in zip(params, node.args, strict=False)
        ]
        node.keywords = named + node.keywords
        node.args = []
        source = ast.unparse(node)
    calls = parse_tool_calls(source)
    if len(calls) != 1:
        raise ValueError(f"ground truth {source!r} is not exactly one call")
    return calls[0]


def _render_result(result: Any) -> str:
    """A method's return value as BFCL shows it to the model."""
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            pass
    return str(result)


# --------------------------------------------------------------------------- environment


class BfclEnvironment(ToolEnvironment):
    """One BFCL multi-turn entry at a time, on fresh instances of its tool classes."""

    name = "bfcl"

    def __init__(self) -> None:
        self._task: Task | None = None
        self._turn = 0
        self._done = True
        self._owners: dict[str, Any] = {}  # tool name -> the instance whose method it is
        self._available: list[str] = []
        self._schemas: dict[str, dict[str, Any]] = {}
        self._current_calls: list[str] = []
        self._closed_turns: list[list[str]] = []
        self._steps: list[Step] = []  # this episode's steps, for diagnose() and progress()

    def brief(self) -> EnvironmentBrief:
        """What the synthesis roles' prompts say of BFCL (each task brings its tool classes)."""
        return EnvironmentBrief(
            description="BFCL multi-turn function calling (file system, trading, travel, "
            "messaging APIs); each task brings the API classes it involves, so the tools "
            "differ from task to task"
        )

    # -- protocol

    def tools(self) -> list[dict[str, Any]]:
        # Copies: callers may edit what they get without touching the catalogue.
        return [copy.deepcopy(self._schemas[name]) for name in self._available]

    def reset(self, task: Task) -> str:
        require_bfcl()
        setup = task.setup
        classes: list[str] = list(setup["involved_classes"])
        instances = _fresh_instances(
            classes, setup.get("initial_config", {}), bool(setup.get("long_context", False))
        )
        self._owners = {}
        self._schemas = {}
        for class_name in classes:
            for method in class_methods(class_name):
                self._owners[method] = instances[class_name]
            for schema in class_schemas(class_name):
                self._schemas[schema["function"]["name"]] = schema
        # Only tools that are also methods can be dispatched.
        documented = [name for name in self._schemas if name in self._owners]
        held_out = {name for turn in task.turns for name in turn.added_tools}
        self._available = [name for name in documented if name not in held_out]
        self._task = task
        self._turn = 0
        self._done = False
        self._stopped_by = None  # a new episode: no earlier call's time-out stops its tools
        self._current_calls = []
        self._closed_turns = []
        self._steps = []
        self._add_tools(task.turns[0].added_tools)
        return task.turns[0].query

    def step(self, action: ToolCall | str | Mapping[str, Any]) -> Observation:
        if self._task is None or self._done:
            return Observation(
                text="error: no open turn; the episode has not started or has ended",
                error="episode_over",
            )
        observation = super().step(action)
        call = action if isinstance(action, ToolCall) else _parsed_or_none(action)
        self._steps.append(Step(turn=self._turn, call=call, observation=observation))
        return observation

    def end_turn(self, answer: str | None = None) -> str | None:
        if self._task is None or self._done:
            return None
        self._closed_turns.append(self._current_calls)
        self._current_calls = []
        self._turn += 1
        if self._turn >= len(self._task.turns):
            self._done = True
            return None
        turn = self._task.turns[self._turn]
        self._add_tools(turn.added_tools)
        return turn.query

    def score(self) -> float:
        """1.0 when BFCL's official multi_turn_checker accepts the episode, else 0.0.

        An episode cut off before its last turn scores 0, as BFCL scores a
        force-terminated entry.
        """
        task = self._task
        if task is None or len(self._closed_turns) < len(task.turns):
            return 0.0
        require_bfcl()
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

        setup = task.setup
        # One step per turn holding all its calls: the checker concatenates a
        # turn's step results, so the grouping does not change the verdict.
        decoded = [[calls] if calls else [] for calls in self._closed_turns]
        entry = {
            "id": setup.get("entry_id", task.id),
            "initial_config": setup.get("initial_config", {}),
            "involved_classes": list(setup["involved_classes"]),
        }
        model_name = f"coevolve_{uuid.uuid4().hex}"
        try:
            result = multi_turn_checker(
                decoded,
                ground_truth_strings(task),
                entry,
                setup.get("category", task.family),
                model_name,
            )
        finally:
            forget_checker_instances(model_name)
        return 1.0 if result.get("valid") else 0.0

    def diagnose(self, trajectory: Trajectory | None = None) -> list[str]:
        """SEAL's label per ground-truth user turn (coevolve.envs.diagnosis) of a trajectory of
        the current task, or of the episode played so far."""
        from .diagnosis import bfcl_model_turns, diagnose_bfcl

        task = self._require_task()
        steps = self._steps if trajectory is None else trajectory.steps
        return diagnose_bfcl(task, bfcl_model_turns(task, steps)).labels

    def progress(self) -> float:
        """Graded progress of the episode so far: passed turns / scorable turns (SEAL)."""
        from .diagnosis import bfcl_model_turns, diagnose_bfcl

        task = self._require_task()
        return diagnose_bfcl(task, bfcl_model_turns(task, self._steps)).progress

    # -- internals

    def _require_task(self) -> Task:
        if self._task is None:
            raise RuntimeError("no task: call reset(task) first")
        return self._task

    def _execute(self, call: ToolCall) -> str:
        owner = self._owners.get(call.name)
        if owner is None:
            raise ToolError("unknown_tool", f"unknown tool {call.name!r}")
        # Recorded before running: a call that raises ran in BFCL too, and the
        # checker must replay it to reach the same state.
        self._current_calls.append(bfcl_call_string(call))
        # A copy, so the instance never shares lists with the recorded ToolCall.
        arguments = copy.deepcopy(call.arguments)
        try:
            result = getattr(owner, call.name)(**arguments)
        except Exception as err:  # boundary: model arguments reach BFCL's own tool code
            # Any exception there, TypeError included ("unexpected keyword argument"), is
            # the model's call failing, as BFCL's executor records it; not a bug of ours.
            raise ToolError(
                "tool_error", f"{call.name} failed: {type(err).__name__}: {err}"
            ) from err
        text = _render_result(result)
        if isinstance(result, dict) and "error" in result:
            raise ToolError("api_error", text)
        return text

    def _add_tools(self, names: Sequence[str]) -> None:
        for name in names:
            if name in self._schemas and name in self._owners and name not in self._available:
                self._available.append(name)


def _parsed_or_none(action: str | Mapping[str, Any]) -> ToolCall | None:
    """The single call the dispatcher parsed from model output, or None when it did not parse."""
    try:
        calls = parse_tool_calls(action)
    except ToolCallParseError:
        return None
    return calls[0] if len(calls) == 1 else None


def _fresh_instances(
    classes: Sequence[str], initial_config: Mapping[str, Any], long_context: bool
) -> dict[str, Any]:
    """New instances loaded the way BFCL's execute_multi_turn_func_call loads them."""
    from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

    instances = {}
    for class_name in classes:
        instance = tool_class(class_name)()
        if class_name not in STATELESS_CLASSES:
            config = copy.deepcopy(initial_config.get(class_name, {}))
            instance._load_scenario(config, long_context=long_context)
        instances[class_name] = instance
    return instances
