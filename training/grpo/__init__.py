"""GRPO: the step's trainer (``trainer.py``), its config section ``training.grpo``
(``config.py``), the multi-turn rollout and its trainer, the tool-loop environment, and
the trainer variants (dynamic sampling, reference episodes, replay anchor)."""
