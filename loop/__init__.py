"""Running the loop: building its runtimes from a config, the run lock, LangGraph Studio's entry points (docs/architecture.md)."""
