"""The two state machines (docs/architecture.md): synthesis/ (flagged trajectories in, verified novel tasks out) and cycle/ (the closed loop, one pass per cycle, its stages and their engines)."""
