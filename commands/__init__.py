"""The ``coevolve`` command's subcommands, one module per group; ``coevolve.cli`` assembles them."""
