"""Test helpers that ship with the package, so benchmarks and examples can use them too.

``coevolve.testing.openai_server`` is a small local OpenAI-compatible server
with scripted replies (``python -m coevolve.testing.server_cli`` serves one by
hand). Nothing is imported here, so a ``python -m`` of a module in this package
imports it once.
"""
