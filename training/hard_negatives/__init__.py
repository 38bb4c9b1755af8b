"""Co-Evolving Agents' hard negatives: the target and failure agents (``agents.py``), their
preference pairs (``pairs.py``) and their config section ``hard_negatives`` (``settings.py``)."""
