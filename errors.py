"""Exception groups shared by the package's error boundaries."""

# Bugs in our own code: a boundary that turns failures into data re-raises these first.
PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    TypeError,
    AttributeError,
    NameError,
    AssertionError,
    NotImplementedError,
)
