"""DPO: the step's trainer (``trainer.py``) and its config section ``training.dpo`` (``config.py``)."""
