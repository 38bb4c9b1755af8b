"""memory: see docs/architecture.md."""
