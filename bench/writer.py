"""Benchmark: what the task writer writes for calls it never saw.

    .venv/bin/python bench/writer.py --writer DIR [--split validation] [--per-family 8]
        [--policy MODEL_DIR] [--json OUT]

For each task of ``--split`` (the writer learns from the seed tasks only, so validation
is unseen), the task's reference calls are replayed and rendered as the writer reads
material in synthesis (``agents.roles.task_writer.render_calls``); the writer (greedy, in-process
with transformers, as a served writer would answer at temperature 0) writes the request.
Printed per family and overall:

- readable: a reply with a ``Request:`` line;
- exact: the request is the task's own, word for word (case and spacing aside);
- grounded: it names every value its calls need (the self-curation check,
  ``ungrounded_values``): what curation would keep;
- with ``--policy``: the round trip, the share of tasks the policy solves from the
  written request, beside the share it solves from the true one.

Reads the split only to measure the writer; a run never does. Not run by the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def write_requests(writer_dir: Path, inputs: list[str], prompt: str, batch: int) -> list[str]:
    """The writer's greedy reply to each input, in batches (left padding)."""
    import torch
    from transformers import AutoModelForCausalLM

    from coevolve.common.tokenization import load_tokenizer

    tokenizer = load_tokenizer(writer_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(writer_dir), dtype=torch.float32).eval()
    replies: list[str] = []
    for start in range(0, len(inputs), batch):
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "system", "content": prompt}, {"role": "user", "content": text}],
                tokenize=False,
                add_generation_prompt=True,
            )
            for text in inputs[start : start + batch]
        ]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(
                **encoded,
                max_new_tokens=64,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        width = encoded["input_ids"].shape[1]
        replies += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
        print(f"  written {len(replies)}/{len(inputs)}", file=sys.stderr, flush=True)
    return replies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writer", required=True, help="the writer's model directory")
    parser.add_argument("--split", default="validation")
    parser.add_argument("--per-family", type=int, default=8)
    parser.add_argument("--policy", default=None, help="model directory for the round trip")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()

    from coevolve.agents.prompts import WRITER_PROMPT
    from coevolve.agents.roles.abstractor import normalise
    from coevolve.agents.roles.role_interfaces import Interaction
    from coevolve.agents.roles.task_writer import parse_writing, render_calls, ungrounded_values
    from coevolve.envs.world import WorldEnvironment, load_split

    counts: dict[str, int] = defaultdict(int)
    tasks = []
    for task in load_split(args.split):
        if counts[task.family] < args.per_family:
            counts[task.family] += 1
            tasks.append(task)
    material = []
    for task in tasks:
        env = WorldEnvironment()
        env.reset(task)
        material.append(
            [Interaction(call=c, observation=env.step(c)) for c in task.turns[0].reference_calls]
        )
    started = time.perf_counter()
    replies = write_requests(
        Path(args.writer), [render_calls(m) for m in material], WRITER_PROMPT, args.batch
    )
    write_s = time.perf_counter() - started

    rows: list[dict[str, Any]] = []
    for task, calls, reply in zip(tasks, material, replies, strict=True):
        try:
            query, answer = parse_writing(reply)
        except ValueError:
            rows.append({"task": task, "family": task.family, "readable": False, "reply": reply})
            continue
        rows.append(
            {
                "task": task,
                "family": task.family,
                "readable": True,
                "query": query,
                "answer": answer,
                "exact": normalise(query) == normalise(task.turns[0].query),
                "grounded": not ungrounded_values(query, calls),
            }
        )
    solved_written: dict[str, bool] = {}
    solved_true: dict[str, bool] = {}
    if args.policy:
        from coevolve.agents.policy.local_policy import LocalPolicy
        from coevolve.agents.policy.rollout import run_rollouts
        from coevolve.records import is_success

        policy = LocalPolicy(args.policy, temperature=0.0, max_new_tokens=40)
        readable = [r for r in rows if r["readable"]]
        written = [
            r["task"].model_copy(
                update={
                    "turns": [r["task"].turns[0].model_copy(update={"query": r["query"]})],
                    "reference_answer": r["task"].reference_answer,
                }
            )
            for r in readable
        ]
        for trajectory in run_rollouts(policy, WorldEnvironment, written, max_tool_calls=6):
            solved_written[trajectory.task_id] = is_success(trajectory.score)
        for trajectory in run_rollouts(
            policy, WorldEnvironment, [r["task"] for r in readable], max_tool_calls=6
        ):
            solved_true[trajectory.task_id] = is_success(trajectory.score)

    def share(selected: list[dict], key: str) -> float:
        return sum(bool(r.get(key)) for r in selected) / max(len(selected), 1)

    families = sorted({r["family"] for r in rows})
    table = {}
    print(f"task writer {args.writer} on {len(rows)} {args.split} tasks ({write_s:.0f} s)")
    header = f"{'family':<24}{'n':>4}{'readable':>10}{'exact':>8}{'grounded':>10}"
    if args.policy:
        header += f"{'solved (written)':>18}{'solved (true)':>15}"
    print(header)
    for family in [*families, "overall"]:
        selected = rows if family == "overall" else [r for r in rows if r["family"] == family]
        figures = {
            "n": len(selected),
            "readable": share(selected, "readable"),
            "exact": share(selected, "exact"),
            "grounded": share(selected, "grounded"),
        }
        line = (
            f"{family:<24}{figures['n']:>4}{figures['readable']:>10.0%}"
            f"{figures['exact']:>8.0%}{figures['grounded']:>10.0%}"
        )
        if args.policy:
            ids = [r["task"].id for r in selected if r["readable"]]
            figures["solved_written"] = sum(solved_written.get(i, False) for i in ids) / max(
                len(selected), 1
            )
            figures["solved_true"] = sum(solved_true.get(i, False) for i in ids) / max(
                len(selected), 1
            )
            line += f"{figures['solved_written']:>18.0%}{figures['solved_true']:>15.0%}"
        table[family] = figures
        print(line)
    examples = [
        {"family": r["family"], "true": r["task"].turns[0].query, "written": r.get("query")}
        for r in rows[:: max(1, len(rows) // 12)]
    ]
    for example in examples:
        print(f"  {example['family']}: {example['true']!r} -> {example['written']!r}")
    if args.json:
        written = [
            {
                "task": r["task"].id,
                "family": r["family"],
                "written": r.get("query"),
                "reply": r.get("reply"),
            }
            for r in rows
        ]
        Path(args.json).write_text(
            json.dumps(
                {
                    "writer": args.writer,
                    "split": args.split,
                    "figures": table,
                    "examples": examples,
                    "written": written,
                    "write_s": round(write_s, 1),
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
