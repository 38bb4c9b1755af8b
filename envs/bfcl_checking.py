"""What BFCL's checker needs from us, shared by the environment and the diagnosis.

Importing bfcl-eval (``require_bfcl``), a call in BFCL's decoded string format
(``bfcl_call_string``), a task's ground truth as such strings
(``ground_truth_strings``) and dropping the instances the checker caches under
one episode's model name (``forget_checker_instances``). ``bfcl_eval`` is
imported inside functions only, as in ``coevolve.envs.bfcl``.
"""

from __future__ import annotations

import importlib
import keyword
import math
import re
from types import ModuleType
from typing import Any

from ..records import Task, ToolCall
from .base import ToolError

BFCL_VERSION = "2026.3.23"
INSTALL_COMMAND = f"pip install --no-deps bfcl-eval=={BFCL_VERSION} mpmath"

# The checker evaluates this module's globals; instances live there under
# these names (see multi_turn_utils.execute_multi_turn_func_call).
_CACHE_MODULE = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils"


class BfclNotInstalledError(RuntimeError):
    """bfcl-eval (or mpmath, which its math tools need) is not installed."""


def require_bfcl() -> ModuleType:
    """Import bfcl_eval, or explain how to install it.

    It is installed without its dependencies because the full set is several GB
    and pins an old numpy; mpmath is the one dependency the multi-turn tools need.
    """
    try:
        import bfcl_eval
        import mpmath  # noqa: F401  (MathAPI imports it when first used)
    except ImportError as err:
        raise BfclNotInstalledError(
            f"the BFCL environment needs the bfcl-eval package ({err}). Install it with:\n"
            f"    {INSTALL_COMMAND}\n"
            "(`make test` and `make demo` install it for you)."
        ) from err
    return bfcl_eval


# --------------------------------------------------------------------------- call strings


def bfcl_call_string(call: ToolCall) -> str:
    """The call in BFCL's decoded format, ``name(key='v',n=3)``, for the checker to eval.

    Built only from an identifier name, identifier keys and literal values
    rendered here, so the string can hold nothing but a call with literals.
    """
    if not _is_identifier(call.name):
        raise ToolError("bad_arguments", f"tool name {call.name!r} is not an identifier")
    parts = []
    for key, value in call.arguments.items():
        if not _is_identifier(key):
            raise ToolError("bad_arguments", f"argument name {key!r} is not an identifier")
        parts.append(f"{key}={_literal_source(value)}")
    return f"{call.name}({','.join(parts)})"


def _is_identifier(name: object) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def _literal_source(value: Any) -> str:
    # Exact type checks: a subclass could override __repr__.
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return repr(value)
    if kind is float:
        if not math.isfinite(value):
            raise ToolError("bad_arguments", f"argument value {value!r} is not a finite number")
        return repr(value)
    if kind in (list, tuple):
        return "[" + ", ".join(_literal_source(item) for item in value) + "]"
    if kind is dict:
        items = (f"{_literal_source(k)}: {_literal_source(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    raise ToolError("bad_arguments", f"argument value of type {kind.__name__} is not a literal")


# --------------------------------------------------------------------------- the checker


def ground_truth_strings(task: Task) -> list[list[str]]:
    """BFCL's own strings for a seed task; the reference calls, rendered, otherwise.

    A synthesized task may inherit its parent's setup, ground truth included,
    while its turns are new, so only seed tasks use the stored strings.
    """
    stored = task.setup.get("ground_truth")
    if task.source == "seed" and isinstance(stored, list) and len(stored) == len(task.turns):
        return stored
    return [[bfcl_call_string(call) for call in turn.reference_calls] for turn in task.turns]


def forget_checker_instances(model_name: str) -> None:
    """Drop the checker's cached instances for one episode's model name."""
    module = importlib.import_module(_CACHE_MODULE)
    # Same normalisation BFCL applies to the cache key.
    prefix = re.sub(r"[-./:]", "_", f"{model_name}_")
    namespace = vars(module)
    # list() first: another episode's checker may add entries from another thread.
    for key in [key for key in list(namespace) if key.startswith(prefix)]:
        del namespace[key]
