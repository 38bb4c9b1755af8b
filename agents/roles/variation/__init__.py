"""Variations of a task the agent failed, with no model and no task generator (issue 85).

A variant keeps the parent's calls in the parent's order and the flow of values between
them, and changes the values:

- **slots** are argument values the request states verbatim; each gets a new value from
  the task's own state (another entity of the same kind, or the entity renamed everywhere
  in the state), from other seed tasks' stated values of the same tool argument, or in the
  old value's format (555-0192, 05-14, 09:30, a count), and changes everywhere at once:
  request, calls, texts built from it, the answer, the parent's ``check`` and the state;
- **copied values** (ids, a price, a message body, an error's ``short=``) are read again
  from the variant's own observation at the place the parent read them;
- the variant is replayed in a fresh environment and kept only when every call fails or
  succeeds as the parent's did and the environment's verifier scores it 1.0.

It uses only the ``Environment`` protocol (``envs/base.py``): never a generator, a
sampler or a describer. A task that cannot be varied gets a reason from ``REASONS``.

The room: ``text.py`` (values in text and observations), ``values.py`` (where new values
come from), ``engine.py`` (one variant: plan, draw, replay, verify; ``vary``) and
``roles.py`` (the synthesis graph's explorer and abstractor for it).
"""

from .engine import REASONS, NotVaried, Variant, variation_coverage, vary
from .roles import VariationAbstractor, VariationExplorer
from .values import ValuePools

__all__ = [
    "REASONS",
    "NotVaried",
    "ValuePools",
    "Variant",
    "VariationAbstractor",
    "VariationExplorer",
    "variation_coverage",
    "vary",
]
