"""Benchmark: CPU time to read JSON from an endpoint reply, against the reply's length.

    python bench/parse.py [--lengths 2000,16000,200000] [--shapes repeat,prose,trailing]
                          [--before-up-to 16000] [--repeat 3] [--json]

Three reply shapes a misbehaving endpoint sends (none is valid JSON as a whole):

- ``repeat``: a model looping on one object (``{"summary": ...}\\n`` again and again);
- ``prose``: an unclosed brace in prose, then words (``The answer is { not json blah ...``);
- ``trailing``: one valid object, then words after it.

*before* is langchain-core's ``JsonOutputParser`` (which
``with_structured_output(method="json_schema")`` ran on every structured
reply until issue 17): its partial-JSON parser retries ``json.loads`` after
removing one character at a time, so its time grows with the square of the
length. *after* is ``coevolve.agents.roles.llm.parse_json_reply`` (one scan, each
balanced span parsed once). Times are CPU seconds (``time.process_time``),
the best of ``--repeat`` runs (one run for *before* above 16 KB).

*before* is measured up to ``--before-up-to`` characters (default 16,000) and
estimated above it from the longest measured length by the square law, marked
``~``; ``--before-up-to 200000`` measures it (minutes of CPU per shape). In a
run, a reply longer than the endpoint's limit (16 × max_tokens characters by
default) is rejected before either parser sees it: the *after* column is the
cost of a reply under the limit. Not run by the tests.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from pydantic import BaseModel

from coevolve.agents.roles.llm import parse_json_reply


class Context(BaseModel):
    summary: str
    failure_cause: str = ""


OBJECT = '{"summary": "stopped early", "failure_cause": "missing call"}'
SHAPES: dict[str, Callable[[int], str]] = {
    "repeat": lambda n: ((OBJECT + "\n") * (n // len(OBJECT) + 1))[:n],
    "prose": lambda n: ("The answer is { not json " + "blah " * n)[:n],
    "trailing": lambda n: (OBJECT + " and some more words" * n)[:n],
}


def before(text: str) -> None:
    from langchain_core.exceptions import OutputParserException
    from langchain_core.output_parsers import JsonOutputParser
    from langchain_core.outputs import Generation

    try:
        JsonOutputParser().parse_result([Generation(text=text)])
    except OutputParserException:  # an unreadable reply is an outcome, not a benchmark failure
        pass


def after(text: str) -> None:
    try:
        parse_json_reply(text, Context)
    except ValueError:
        pass


def cpu_seconds(parse: Callable[[str], None], text: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        parse(text)
        best = min(best, time.process_time() - started)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="2000,16000,200000", help="Reply lengths (chars).")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="Reply shapes.")
    parser.add_argument(
        "--before-up-to",
        type=int,
        default=16000,
        help="Measure the old parser up to this length; estimate it above (square law).",
    )
    parser.add_argument("--repeat", type=int, default=3, help="Runs per figure (best kept).")
    parser.add_argument("--json", action="store_true", help="Print one JSON object per row.")
    args = parser.parse_args(argv)
    lengths = sorted(int(n) for n in args.lengths.split(","))
    shapes = args.shapes.split(",")
    unknown = set(shapes) - set(SHAPES)
    if unknown:
        parser.error(f"unknown shapes {sorted(unknown)}; known: {', '.join(SHAPES)}")

    if not args.json:
        print(f"{'shape':9} {'length':>8} {'before s':>11} {'after s':>9} {'before/after':>13}")
    for shape in shapes:
        measured: tuple[int, float] | None = None
        for length in lengths:
            text = SHAPES[shape](length)
            after_s = cpu_seconds(after, text, args.repeat)
            estimated = length > args.before_up_to and measured is not None
            if estimated:
                assert measured is not None
                base_length, base_s = measured
                before_s = base_s * (length / base_length) ** 2
            else:
                runs = args.repeat if length <= 16000 else 1
                before_s = cpu_seconds(before, text, runs)
                measured = (length, before_s)
            ratio = before_s / after_s if after_s > 0 else float("inf")
            row = {
                "shape": shape,
                "length": length,
                "before_s": round(before_s, 5),
                "before_estimated": estimated,
                "after_s": round(after_s, 6),
                "ratio": round(ratio, 1),
            }
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                mark = "~" if estimated else " "
                print(
                    f"{shape:9} {length:>8} {mark}{before_s:>10.4f} {after_s:>9.5f} {ratio:>12.0f}x",
                    flush=True,
                )


if __name__ == "__main__":
    main()
