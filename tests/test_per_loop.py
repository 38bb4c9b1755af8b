"""PerLoop: one value per event loop, closed loops' values let go."""

from __future__ import annotations

import asyncio

import pytest

from coevolve.agents.policy.per_loop import PerLoop


def test_one_value_per_loop_made_once():
    made: list[object] = []

    def make() -> object:
        made.append(object())
        return made[-1]

    holder = PerLoop(make)

    async def twice() -> tuple[object, object]:
        return holder.get(), holder.get()

    first, again = asyncio.run(twice())
    assert first is again and len(made) == 1
    second, _ = asyncio.run(twice())
    assert second is not first and len(made) == 2


def test_closed_loops_values_are_dropped_when_the_next_is_made():
    holder = PerLoop(object)
    loops = [asyncio.new_event_loop() for _ in range(3)]
    for loop in loops[:2]:
        loop.run_until_complete(_get(holder))
    loops[0].close()
    loops[2].run_until_complete(_get(holder))
    assert set(holder._values) == {loops[1], loops[2]}
    for loop in loops[1:]:
        loop.close()


def test_pop_forgets_the_running_loops_value_and_clear_all():
    holder = PerLoop(object)

    async def pop_twice() -> tuple[object, object | None, object | None]:
        value = holder.get()
        return value, holder.pop(), holder.pop()

    value, popped, none = asyncio.run(pop_twice())
    assert popped is value and none is None
    asyncio.run(_get(holder))
    holder.clear()
    assert holder._values == {}


def test_outside_a_loop_is_an_error():
    with pytest.raises(RuntimeError, match="no running event loop"):
        PerLoop(object).get()


async def _get(holder: PerLoop[object]) -> object:
    return holder.get()
