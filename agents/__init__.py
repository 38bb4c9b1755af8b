"""agents: see docs/architecture.md."""
