"""Memory: outcome history, pattern counts, signals, and the Chroma task store."""

from .history import OutcomeHistory
from .patterns import PatternCounts
from .signals import FlaggedTrajectory, SignalConfig, detect_signals
from .store import DedupResult, Duplicate, TaskStore, task_text

__all__ = [
    "DedupResult",
    "Duplicate",
    "FlaggedTrajectory",
    "OutcomeHistory",
    "PatternCounts",
    "SignalConfig",
    "TaskStore",
    "detect_signals",
    "task_text",
]
