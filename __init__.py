"""coevolve: train LLM agents by agent-data mutual evolution."""

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
from .runner import RunResult, resume, run
from .summary import CycleSummary

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
    "resume",
    "run",
]
