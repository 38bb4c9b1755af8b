"""The training loop: its runtime, stages, cycle graph and Studio entry points (docs/architecture.md)."""
