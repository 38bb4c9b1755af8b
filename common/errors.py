"""Exception groups shared by the package's error boundaries."""

# Bugs in our own code: a boundary that turns failures into data re-raises these first.
PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    TypeError,
    AttributeError,
    NameError,
    AssertionError,
    NotImplementedError,
)


class RunError(RuntimeError):
    """A run that cannot start or continue; the message says what to do."""


# Errors whose message tells a person what went wrong and what to do: a command ends on
# one of these with that message on one line (``--debug`` shows the traceback instead).
# Named by module, since most of these modules are heavy; an error whose module was never
# imported cannot have been raised.
KNOWN_ERRORS: tuple[tuple[str, str], ...] = (
    ("common.config_base", "ConfigError"),
    ("training.bootstrap.smollm2", "BaseModelError"),
    ("agents.policy.policy_interface", "PolicyError"),
    ("agents.roles.llm", "ReplyError"),
    ("graph.synthesis.graph", "SynthesisError"),
    ("common.errors", "RunError"),
)


def is_known_error(err: BaseException) -> bool:
    """Whether ``err`` is one of ``KNOWN_ERRORS`` (raised by this package, with a message for
    a person rather than a bug's traceback)."""
    import sys

    package = __name__.split(".")[0]  # the package's root (this module is common.errors)
    for module, name in KNOWN_ERRORS:
        error_class = getattr(sys.modules.get(f"{package}.{module}"), name, None)
        if isinstance(error_class, type) and isinstance(err, error_class):
            return True
    return False
