"""LangGraph Studio's graphs: where Studio's JSON context becomes a runtime.

``langgraph.json`` names the two factories here. The server calls a factory
each time it needs a graph: to draw it or read its schemas (no context), and
to run it (``runtime.execution_runtime``, with the JSON the user typed in
Studio's context form). Only a run builds the heavy runtime, through the
composition root (``loop/build_runtime.py``), and gets the graph bound to it.

The forms Studio shows are ``StudioCycleContext`` (the config to run) and
``StudioSynthesisContext`` (the environment, roles and store of a pass).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar, cast

from langgraph.graph.state import CompiledStateGraph
from langgraph_sdk.runtime import ServerRuntime
from pydantic import JsonValue

from ..agents.roles.role_interfaces import Synthesizer
from ..graph.cycle.context import CycleRuntime
from ..graph.cycle.graph import graph as cycle_graph
from ..graph.synthesis.context import SynthesisRuntime
from ..graph.synthesis.graph import graph as synthesis_graph
from .build_runtime import build_bootstrap_agent, build_runtime, spec_synthesis_runtime

DEFAULT_CONFIG = "configs/quickstart.yaml"
Form = TypeVar("Form")


@dataclass
class StudioCycleContext:
    """Studio's context form for the cycle graph."""

    config: str = DEFAULT_CONFIG  # a coevolve config file, relative to the project


@dataclass
class StudioSynthesisContext:
    """Studio's context form for the synthesis graph (defaults: the built-in world,
    variations of the flagged tasks and an in-memory task store, so a pass runs without a
    model)."""

    env: str = "world"
    synthesizer: Synthesizer = "variation"  # synthesis.synthesizer: variation, generator, llm
    roles: dict[str, JsonValue] = field(default_factory=dict)  # a RolesConfig, as JSON
    endpoints: dict[str, JsonValue] = field(default_factory=dict)  # name -> EndpointConfig
    store_path: str | None = None
    threshold: float = 0.8


class ContextBoundGraph(CompiledStateGraph[Any, Any, Any, Any]):
    """A compiled graph that runs with one runtime context, whatever context the
    caller sends: the server passes Studio's JSON, the nodes need the runtime."""

    def __init__(
        self, *, bound_context: CycleRuntime | SynthesisRuntime | None, **attributes: Any
    ) -> None:
        super().__init__(**attributes)
        self.bound_context = bound_context

    def stream(self, *args: Any, context: Any = None, **kwargs: Any) -> Iterator[Any]:
        return super().stream(*args, context=self.bound_context, **kwargs)

    def astream(self, *args: Any, context: Any = None, **kwargs: Any) -> AsyncIterator[Any]:
        return super().astream(*args, context=self.bound_context, **kwargs)


def _form(schema: type[Form], context: object) -> Form:
    """Studio's JSON context as the form's dataclass, or an error naming the fields."""
    if context is None:
        return schema()
    if isinstance(context, schema):
        return context
    names = [f.name for f in fields(cast(Any, schema))]
    if not isinstance(context, dict) or set(context) - set(names):
        raise ValueError(
            f"the context {context!r} is not a {schema.__name__}: give a JSON object "
            f"with the fields {', '.join(names)}"
        )
    return schema(**context)


def _bound(
    compiled: CompiledStateGraph[Any, Any, Any, Any],
    form: type[object],
    runtime: CycleRuntime | SynthesisRuntime | None,
) -> ContextBoundGraph:
    # A copy, as Pregel.copy makes one: the module's compiled graph is left as it is.
    attributes = {key: value for key, value in vars(compiled).items() if key != "__orig_class__"}
    # Studio's form is the schema it shows; the nodes get the runtime built from it.
    attributes["context_schema"] = form
    return ContextBoundGraph(bound_context=runtime, **attributes)


def cycle(runtime: ServerRuntime) -> ContextBoundGraph:
    """The cycle graph; a run builds the runtime of the config Studio's context names."""
    execution = runtime.execution_runtime
    bound = None
    if execution is not None:
        from ..config import load_config

        form = _form(StudioCycleContext, execution.context)
        config = load_config(form.config)
        build_bootstrap_agent(config, progress=False)  # the one step that may train
        bound = build_runtime(config, progress=False)
    return _bound(cycle_graph, StudioCycleContext, bound)


def synthesis(runtime: ServerRuntime) -> ContextBoundGraph:
    """The synthesis graph; a run builds the pass's runtime from Studio's context."""
    execution = runtime.execution_runtime
    bound = None
    if execution is not None:
        form = _form(StudioSynthesisContext, execution.context)
        bound = spec_synthesis_runtime(**asdict(form))
    return _bound(synthesis_graph, StudioSynthesisContext, bound)
