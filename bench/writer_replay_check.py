"""Does the task writer served now write what a finished compose unit's writer wrote?

    python bench/writer_replay_check.py UNIT.tasks.jsonl [--cycle 1] [--limit 30]
        [--base-url http://127.0.0.1:8011/v1] [--model runs/writer-n100] [--strict]

A compose unit keeps its accepted tasks (docs/figures/bench-compose-n100/units), each a
chain of calls the composer made in its parent's state, and the request the clause writer
joined from one clause per call. This replays each chain in a fresh world from that state
(a cycle-2 task's parent may be a cycle-1 task of the same unit: its seed task's state),
asks the served writer for every clause with the material the clause writer gives it
(``clause_input``; greedy, 64 tokens, as the verdict's units ask), joins the clauses as
the clause writer does, and counts the requests and clauses that come out the same,
printing those that differ. ``--strict`` exits with 1 when any request differs.

Why: a writer rebuilt in a later session is checked against the verdict's weights hash;
weights that differ (another CPU rounds the same training differently) still make the
same synthesizer if they write the same text. Run it from the verdict's worktree code
(scripts/verdict-compose-n100.sh check-writer does) with the writer served on :8011.
Reads train-split seed tasks only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Rewritten:
    """One accepted task's request as its unit wrote it and as the writer writes it now."""

    task_id: str
    unit: str
    now: str
    clauses: int
    same_clauses: int

    @property
    def same(self) -> bool:
        return self.unit == self.now


def rewrite(
    records: Sequence[dict[str, Any]], model: Any, unit: Sequence[dict[str, Any]] = ()
) -> Iterator[Rewritten]:
    """Each record (a line of a unit's ``.tasks.jsonl``) written again by ``model``, clause by
    clause, from a replay of its calls in its seed task's state, one at a time as it is
    written; ``unit`` holds the unit's other records, where a synthesized parent is looked
    up."""
    from coevolve.agents.prompts import WRITER_PROMPT
    from coevolve.agents.roles.clause_writer import JOINER, clause_input, join_clauses
    from coevolve.agents.roles.judge import execute_candidate
    from coevolve.agents.roles.role_interfaces import Interaction, candidate_setup
    from coevolve.agents.roles.task_writer import parse_writing, write
    from coevolve.envs.world import WorldEnvironment, load_split
    from coevolve.records import CandidateTask, ToolCall

    seeds = {task.id: task for task in load_split("train")}
    by_id = {record["id"]: record for record in [*unit, *records]}

    def seed_setup(record: dict[str, Any]) -> dict[str, Any]:
        while record["parent_task_id"] not in seeds:
            parent = by_id.get(record["parent_task_id"])
            if parent is None:
                raise ValueError(
                    f"{record['id']}: its parent {record['parent_task_id']} is neither a "
                    "train seed task nor a task of this file"
                )
            record = parent
        return candidate_setup(seeds[record["parent_task_id"]].setup)

    for record in records:
        calls = [ToolCall(name=c["name"], arguments=c["arguments"]) for c in record["calls"]]
        candidate = CandidateTask(
            description="replay", query="(replay)", minimal_actions=calls, setup=seed_setup(record)
        )
        steps = execute_candidate(candidate, WorldEnvironment).steps
        chain = [Interaction(call=s.call, observation=s.observation) for s in steps if s.call]
        clauses = [
            parse_writing(
                asyncio.run(write(model, WRITER_PROMPT, clause_input(call, chain[:number])))
            )[0]
            for number, call in enumerate(chain)
        ]
        now, then = join_clauses(clauses, calls), record["requests"][0]
        then_parts = then.split(JOINER)
        same = sum(a == b for a, b in zip(now.split(JOINER), then_parts, strict=False))
        yield Rewritten(record["id"], then, now, len(then_parts), same)


def main() -> None:
    from coevolve.agents.config import EndpointConfig
    from coevolve.agents.roles.llm import chat_model
    from coevolve.common.files import read_jsonl

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tasks", type=Path, help="a unit's accepted tasks (.tasks.jsonl)")
    parser.add_argument("--cycle", type=int, default=None, help="only this cycle's tasks")
    parser.add_argument("--limit", type=int, default=None, help="at most this many tasks")
    parser.add_argument("--base-url", default="http://127.0.0.1:8011/v1")
    parser.add_argument("--model", default="runs/writer-n100")
    parser.add_argument("--json", type=Path, default=None, help="write every comparison here")
    parser.add_argument("--strict", action="store_true", help="exit 1 when any request differs")
    args = parser.parse_args()

    endpoint = EndpointConfig(
        base_url=args.base_url, model=args.model, temperature=0.0, max_tokens=64, timeout_s=600
    )
    model = chat_model(endpoint)
    records = read_jsonl(args.tasks)
    chosen = [r for r in records if args.cycle is None or r.get("cycle") == args.cycle]
    chosen = chosen[: args.limit]
    rows = []
    for number, row in enumerate(rewrite(chosen, model, unit=records), 1):
        rows.append(row)
        print(f"[{number}/{len(chosen)}] {'same' if row.same else 'DIFFERS'}: {row.task_id}")
        if not row.same:
            print(f"    unit: {row.unit}\n    now:  {row.now}", flush=True)
    same = sum(row.same for row in rows)
    print(
        f"requests the same: {same}/{len(rows)}; clauses the same: "
        f"{sum(r.same_clauses for r in rows)}/{sum(r.clauses for r in rows)}"
    )
    if args.json:
        args.json.write_text(
            json.dumps([row.__dict__ for row in rows], indent=1, ensure_ascii=False) + "\n"
        )
    if args.strict and same < len(rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
