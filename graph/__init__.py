"""The synthesis graph: flagged trajectories in, verified novel tasks out (docs/architecture.md)."""
