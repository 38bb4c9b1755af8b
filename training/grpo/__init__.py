"""GRPO: the step's trainer (``grpo_trainer.py``; its config section ``training.grpo`` is
``training/grpo_config.py``, beside ``training/config.py``), the multi-turn rollout and
its trainer, the tool-loop environment, and the trainer variants (dynamic sampling,
reference episodes, replay anchor)."""
