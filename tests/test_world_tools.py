"""The world's tool schemas are derived from the World methods that implement them, and the
mutating tools from their ``@mutating`` mark: both equal what the policy saw before."""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path

from coevolve.envs.base import ToolError
from coevolve.envs.world import APPS, TOOL_NAMES, World, WorldEnvironment, load_split
from coevolve.envs.world.apps import MUTATING_TOOLS, tool_schemas

# The schemas as they were kept by hand before they were derived (json.dumps order kept).
SNAPSHOT = Path(__file__).parent / "data" / "world_tools.json"
# The hand-kept MUTATING_TOOLS of before.
MUTATING_BEFORE = {
    "add_contact",
    "update_phone",
    "delete_contact",
    "send_message",
    "delete_message",
    "create_event",
    "move_event",
    "cancel_event",
    "create_note",
    "append_note",
    "delete_note",
    "add_to_cart",
    "remove_from_cart",
    "checkout",
    "cancel_order",
    "top_up",
    "set_reminder",
    "delete_reminder",
}


def test_derived_schemas_are_the_snapshot_byte_for_byte():
    # Compared as text, so key order (and with it the rendered prompt) is checked too.
    assert json.dumps(tool_schemas(), indent=2) + "\n" == SNAPSHOT.read_text()
    assert WorldEnvironment().tools() == tool_schemas()


def test_every_public_world_method_is_a_tool_of_one_app():
    public = [
        name
        for name, member in vars(World).items()
        if inspect.isfunction(member) and not name.startswith("_") and name != "run"
    ]
    assert public == list(TOOL_NAMES)
    assert len(set(TOOL_NAMES)) == sum(len(tools) for tools in APPS.values())


def test_mutating_tools_are_the_marked_ones_and_the_same_as_before():
    assert MUTATING_TOOLS == MUTATING_BEFORE
    assert MUTATING_TOOLS <= set(TOOL_NAMES)


def test_only_mutating_tools_change_the_state():
    changed_by: set[str] = set()
    for task in load_split("validation"):
        world = World(copy.deepcopy(task.setup["state"]))
        for call in task.reference_calls:
            before = copy.deepcopy(world.state)
            try:
                world.run(call.name, dict(call.arguments))
            except ToolError:  # a planned failure (a lookup of what is not there yet)
                continue
            if world.state != before:
                changed_by.add(call.name)
    assert changed_by <= MUTATING_TOOLS
    assert len(changed_by) >= len(MUTATING_TOOLS) // 2  # the check saw enough of them
