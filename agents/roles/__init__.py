"""The synthesis roles: their interfaces (``role_interfaces.py``), summarizer, explorers,
abstractors and judges, the variation roles (``variation/``), built by ``role_factory.py``
for the run's ``synthesis.synthesizer``; their
chat model (``chat_endpoint.py``, ``llm.py``) and reply parsing. They use the policy side
(``agents/policy/``), never the other way."""
