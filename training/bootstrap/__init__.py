"""The bootstrap policy: its build and cache (``build.py``), config (``bootstrap_config.py``) and
corpus (``corpus.py``), the SmolLM2 and other base models, and the tiny test model."""
