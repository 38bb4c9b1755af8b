"""Reports that agree with themselves (issue 88, item 5): the run summary counts synthesized
tasks by the family of their parent, with the tool sequence beside it, and `coevolve eval`'s
per-family column counts the failed tool calls its footer lists."""

from __future__ import annotations

from rich.console import Console

from coevolve.agents.policy.eval_report import evaluation_report
from coevolve.outputs.report import metrics_rows, print_summary
from coevolve.outputs.summary import (
    UNKNOWN_PARENT,
    CycleSummary,
    synthesized_by_parent_family,
)
from coevolve.records import Observation, Step, Task, ToolCall, Trajectory, Turn


def task(task_id: str, family: str, calls: list[str], **provenance) -> Task:
    turn = Turn(query="q", reference_calls=[ToolCall(name=name) for name in calls])
    return Task(id=task_id, env="desk", family=family, turns=[turn], **provenance)


SEEDS = [
    task("balance-01", "balance_lookup", ["find_account", "balance"]),
    task("pay-01", "pay_bill", ["find_account", "add_payee", "transfer"]),
]
# A user environment has no structure key: a synthesized task's family is its tool sequence.
EARLIER = task(
    "s-0", "find_account>balance", ["find_account", "balance"], source="synthesized",
    parent_task_id="balance-01",
)  # fmt: skip
ACCEPTED = [
    task("s-1", "find_account>balance", ["find_account", "balance"], source="synthesized",
         parent_task_id="balance-01"),
    task("s-2", "find_account", ["find_account"], source="synthesized",
         parent_task_id="balance-01"),
    task("s-3", "add_payee>transfer", ["add_payee", "transfer"], source="synthesized",
         parent_task_id="pay-01"),
    task("s-4", "balance", ["balance"], source="synthesized", parent_task_id="s-0"),
    task("s-5", "balance", ["balance"], source="synthesized", parent_task_id="gone"),
]  # fmt: skip


def test_synthesized_tasks_count_under_the_family_of_the_seed_they_descend_from():
    counts = synthesized_by_parent_family(ACCEPTED, [*SEEDS, EARLIER])
    assert counts == {
        UNKNOWN_PARENT: {"balance": 1},
        "balance_lookup": {"find_account>balance": 1, "find_account": 1, "balance": 1},
        "pay_bill": {"add_payee>transfer": 1},
    }


def test_the_summary_table_shows_them_by_family_and_tool_sequence():
    by_parent = synthesized_by_parent_family(ACCEPTED, [*SEEDS, EARLIER])
    cycle = CycleSummary.model_validate(
        {
            "cycle": 1,
            "synthesize": {"accepted": 5, "by_parent_family": by_parent, "time_s": 1.0},
            "evaluate": {
                "success": 0.5, "tool_sequence": 0.5, "calls": 0.5, "episodes": 4,
                "by_family": {"balance_lookup": 0.5, "pay_bill": 0.5}, "time_s": 1.0,
            },
        }
    )  # fmt: skip
    [row] = metrics_rows([cycle])
    assert row["accepted_by_parent_family"] == {
        UNKNOWN_PARENT: 1,
        "balance_lookup": 3,
        "pay_bill": 1,
    }
    console = Console(record=True, width=200)
    print_summary(console, [cycle])
    lines = [
        " ".join(line.replace("│", " ").split()) for line in console.export_text().splitlines()
    ]
    assert any(line.startswith("balance_lookup 50.0%") and line.endswith(" 3") for line in lines)
    assert "balance_lookup find_account>balance 1" in lines
    assert "pay_bill add_payee>transfer 1" in lines


def test_evals_failed_calls_per_family_sum_to_the_kinds_its_footer_lists():
    def episode(family: str, errors: list[str | None]) -> Trajectory:
        steps = [
            Step(call=ToolCall(name="transfer"), observation=Observation(text="x", error=error))
            for error in errors
        ]
        return Trajectory(
            id=family, task_id=family, env="desk", family=family, steps=steps, score=0.0
        )

    trajectories = [
        episode("pay_bill", ["bad_arguments", None, "unknown_owner"]),
        episode("balance_lookup", ["timeout", "bad_arguments"]),
    ]
    report = evaluation_report(trajectories, [], "desk", {"split": "heldout"}, "p")
    assert report.by_family["pay_bill"].failed_calls == 2
    assert report.by_family["balance_lookup"].failed_calls == 2
    assert report.overall.failed_calls == sum(report.overall.call_errors.values()) == 4
    assert report.overall.errors == 0  # episodes ended on a policy error: none
