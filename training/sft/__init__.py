"""SFT: the step's trainer (``trainer.py``) and its config section ``training.sft`` (``config.py``)."""
