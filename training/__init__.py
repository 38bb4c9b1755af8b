"""training: see docs/architecture.md."""
