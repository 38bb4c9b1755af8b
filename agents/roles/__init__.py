"""The synthesis roles: their interfaces (``role_interfaces.py``), summarizer, explorer,
abstractors, task writer, judge, teacher and composer, built by ``role_factory.py``; their
chat model (``chat_endpoint.py``, ``llm.py``) and reply parsing. They use the policy side
(``agents/policy/``), never the other way."""
