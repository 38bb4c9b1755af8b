"""The task writer: its build (``build.py``) and config section ``writer`` (``config.py``)."""
