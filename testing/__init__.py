"""Test helpers that ship with the package, so benchmarks and examples can use them too.

``coevolve.testing.openai_server`` is a small local OpenAI-compatible server
with scripted replies. It is not imported here: ``python -m
coevolve.testing.openai_server`` would otherwise import the module twice.
"""
