"""The synthesis graph: flagged trajectories in, verified novel tasks out: its state, context and config beside it."""
