"""coevolve: train LLM agents by agent-data mutual evolution."""

from typing import TYPE_CHECKING, Any

from .records import (
    CandidateTask,
    Observation,
    Signal,
    Step,
    SynthesisContext,
    Task,
    ToolCall,
    Trajectory,
    Turn,
    Verdict,
)

if TYPE_CHECKING:
    from .loop.build_runtime import build_bootstrap_agent, build_runtime
    from .outputs.summary import CycleSummary
    from .runner import RunResult, resume, run

# The loop's entry points pull in the graph, training configs and environments:
# loaded on first use, so `coevolve --help` and `import coevolve.records` stay light.
_LAZY = {
    "RunResult": "runner",
    "resume": "runner",
    "run": "runner",
    "CycleSummary": "outputs.summary",
    # the stages' runtime, for a script that calls the stages itself (graph/cycle/stages.py)
    "build_bootstrap_agent": "loop.build_runtime",
    "build_runtime": "loop.build_runtime",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "CandidateTask",
    "CycleSummary",
    "Observation",
    "RunResult",
    "Signal",
    "Step",
    "SynthesisContext",
    "Task",
    "ToolCall",
    "Trajectory",
    "Turn",
    "Verdict",
    "__version__",
    "build_bootstrap_agent",
    "build_runtime",
    "resume",
    "run",
]
