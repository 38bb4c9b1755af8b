"""Helpers every part of the package uses: atomic files and JSON lines
(``files``), the errors that end a command in one line (``errors``), the
config sections' base classes (``config_base``) and loading a tokenizer
(``tokenization``)."""
