"""What a finished run leaves for a person: the rows report.png plots (metrics.jsonl),
summary.json, and the tables `coevolve run` ends with, on hand-made cycle summaries."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from coevolve.envs.world import load_split
from coevolve.memory.pool import TaskPool
from coevolve.outputs.report import metrics_rows, overhead_share, print_summary, write_report
from coevolve.outputs.summary import CycleSummary

BASELINE = {
    "cycle": 0,
    "evaluate": {
        "success": 0.25,
        "tool_sequence": 0.5,
        "calls": 0.5,
        "episodes": 4,
        "by_family": {"alpha": 0.5, "beta": 0.0},
        "time_s": 10.0,
    },
}
CYCLE_1 = {
    "cycle": 1,
    "rollout": {"tasks": 4, "seed_tasks": 3, "synthesized_tasks": 1, "success": 0.375, "episodes": 8, "diagnosis": {"wrong_tool": 3}, "time_s": 20.0},
    "signals": {
        "by_kind": {"forgetting": 0, "boundary": 2, "rare": 1, "unsolved": 3},
        "kept_by_kind": {"boundary": 2, "unsolved": 1},
        "flagged": 6,
        "kept": 3,
        "flag_precision": 2 / 3,
        "by_family": {"beta": {"flagged_items": 4, "kept_items": 3, "rollout_success": 0.25}},
        "time_s": 1.0,
    },
    "synthesize": {"candidates": 5, "accepted": 2, "duplicates": 1, "by_family": {"beta": 2},
                   "time_s": 5.0},
    "pool": {"added": 2, "seed": 40, "size": 42, "synthesized": 2, "time_s": 1.0},
    # the train stage counts its whole time; 30 of its 40 seconds are optimiser steps
    "train": {"algorithm": "sft", "adapter_dir": "adapters/cycle-1", "examples": 12, "steps": 3, "final_loss": 1.2345, "stage_time_s": 40.0,
              "time_s": 35.0, "train_time_s": 30.0},
    "evaluate": {
        "success": 0.5,
        "tool_sequence": 0.75,
        "calls": 0.75,
        "episodes": 4,
        "by_family": {"alpha": 0.5, "beta": 0.5},
        "time_s": 28.0,
    },
}  # fmt: skip
CYCLES = [CycleSummary.model_validate(cycle) for cycle in (BASELINE, CYCLE_1)]


def test_metrics_rows_carry_each_stage_figure():
    baseline, first = metrics_rows(CYCLES)
    assert baseline["heldout_success"] == 0.25 and baseline["heldout_by_family"]["beta"] == 0.0
    assert baseline["signals"] == {} and baseline["train_loss"] is None
    assert baseline["stage_time_s"] == {"evaluate": 10.0}
    assert baseline["overhead_share"] is None  # nothing trained: no overhead to speak of
    assert first["heldout_success"] == 0.5 and first["heldout_tool_sequence"] == 0.75
    assert (first["rollout_success"], first["rollout_episodes"]) == (0.375, 8)
    assert first["signals"]["unsolved"] == 3 and first["signals_kept"] == {
        "boundary": 2,
        "unsolved": 1,
    }
    beta = first["flags_by_family"]["beta"]
    assert (beta["flagged_items"], beta["kept_items"], beta["rollout_success"]) == (4, 3, 0.25)
    assert (first["candidates"], first["accepted"], first["duplicates"]) == (5, 2, 1)
    assert first["accepted_by_family"] == {"beta": 2}
    assert (first["pool_size"], first["pool_synthesized"]) == (42, 2)
    assert (first["train_examples"], first["train_steps"], first["train_loss"]) == (12, 3, 1.2345)
    # the train stage's stage_time_s (its whole stage) wins over its time_s
    assert first["stage_time_s"] == {
        "rollout": 20.0,
        "signals": 1.0,
        "synthesize": 5.0,
        "pool": 1.0,
        "train": 40.0,
        "evaluate": 28.0,
    }
    # 95 s in all; rollouts 20 + evaluation 28 + optimiser steps 30 = 78 s busy
    assert first["overhead_share"] == pytest.approx(17 / 95)
    assert overhead_share(CYCLES[1]) == first["overhead_share"]


def test_write_report_writes_the_rows_the_summary_and_the_figure(tmp_path):
    seeds = load_split("validation")[:2]
    synthesized = seeds[0].model_copy(
        update={"id": "synth-1", "source": "synthesized", "signal": "unsolved", "cycle": 1}
    )
    pool = TaskPool([*seeds, synthesized])
    paths = write_report(tmp_path, CYCLES, pool)
    rows = [json.loads(line) for line in paths["metrics"].read_text().splitlines()]
    assert rows == json.loads(json.dumps(metrics_rows(CYCLES)))
    summary = json.loads(paths["summary"].read_text())
    assert summary == {
        "cycles": [cycle.model_dump(mode="json") for cycle in CYCLES],
        "pool": {"seed": 2, "synthesized": 1, "signal:unsolved": 1},
    }
    assert paths["report"] == tmp_path / "report.png"
    assert paths["report"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # no cycles: the files, but no figure
    (tmp_path / "empty").mkdir()
    empty = write_report(tmp_path / "empty", [], None)
    assert "report" not in empty and empty["metrics"].read_text() == ""


def test_summary_tables_show_each_cycle_family_and_stage():
    console = Console(record=True, width=400)
    print_summary(console, CYCLES, {"seed": 40, "synthesized": 2, "signal:unsolved": 2})
    lines = console.export_text().splitlines()

    def row(first_cell: str, after: str) -> list[str]:
        """The cells of the first table row starting with ``first_cell`` below the title
        line containing ``after``."""
        start = next(i for i, line in enumerate(lines) if after in line)
        for line in lines[start:]:
            cells = [cell.strip() for cell in line.strip("│┃ ").split("│")]
            if cells and cells[0] == first_cell:
                return cells
        raise AssertionError(f"no row {first_cell!r} under {after!r}")

    # cycle, held-out, tool seq, rollout, flag prec., synth/acc/dup, pool, loss, overhead
    assert row("1", "per cycle") == [
        "1", "50.0%", "75.0%", "37.5%", "66.7%", "5/2/1", "42", "1.234", "17.9%",
    ]  # fmt: skip
    # cycle, forgetting, boundary, rare, unsolved, flagged / kept
    assert row("1", "signals flagged") == ["1", "0", "2", "1", "3", "6 / 3"]
    assert row("0", "per cycle")[:3] == ["0", "25.0%", "50.0%"]
    # family, cycle 0, cycle 1, change (points), flagged, kept, synthesized
    assert row("beta", "per family") == ["beta", "0.0%", "50.0%", "+50.0", "4", "3", "2"]
    assert row("alpha", "per family") == ["alpha", "50.0%", "50.0%", "+0.0", "0", "0", "0"]
    # cycle, rollout, signals, synthesize, pool, train, evaluate, total
    assert row("1", "seconds per stage") == [
        "1",
        "20.0 (21%)",
        "1.0 (1%)",
        "5.0 (5%)",
        "1.0 (1%)",
        "40.0 (42%)",
        "28.0 (29%)",
        "95.0",
    ]
    text = "\n".join(lines)
    assert "cycle 1 rollout diagnosis (SEAL labels): wrong_tool 3" in text
    assert "pool: 40 seed + 2 synthesized tasks (unsolved 2)" in text


def _table_blocks(lines: list[str]) -> list[list[str]]:
    """The lines of each rich table (heavy-head box) in a captured summary."""
    blocks, block = [], None
    for line in lines:
        if line.lstrip().startswith("┏"):
            block = []
        if block is not None:
            block.append(line.strip())
        if block is not None and line.lstrip().startswith("└"):
            blocks.append(block)
            block = None
    return blocks


def _long_run() -> list[CycleSummary]:
    """Six cycles of a run at full size: long family names, thousands of seconds, every
    signal kind, three-digit counts."""
    families = ["add_contact", "move_and_tell_two", "reschedule_and_notify", "price_check"]
    cycles = [
        CycleSummary.model_validate(
            {**BASELINE, "evaluate": {**BASELINE["evaluate"], "episodes": 216,
                                      "by_family": {f: 0.125 for f in families}}}
        )
    ]  # fmt: skip
    for cycle in range(1, 7):
        data = json.loads(json.dumps(CYCLE_1))
        data["cycle"] = cycle
        data["rollout"].update(success=0.4321, episodes=2048, time_s=1234.5)
        data["signals"].update(
            by_kind={"forgetting": 123, "boundary": 456, "rare": 78, "unsolved": 910},
            kept_by_kind={"boundary": 48},
            flagged=1567,
            kept=48,
            flag_precision=1.0,
            by_family={f: {"flagged_items": 1234, "kept_items": 123, "rollout_success": 0.5}
                       for f in families},
        )  # fmt: skip
        data["synthesize"].update(candidates=1234, accepted=480, duplicates=123,
                                  by_family={f: 120 for f in families})  # fmt: skip
        data["pool"].update(size=12345, seed=1000, synthesized=11345, time_s=12.3)
        data["train"].update(final_loss=0.0123, stage_time_s=9876.5, train_time_s=9000.0)
        data["evaluate"].update(
            success=1.0, tool_sequence=1.0, episodes=216, time_s=543.2,
            by_family={f: 0.5 + cycle / 100 for f in families},
        )  # fmt: skip
        cycles.append(CycleSummary.model_validate(data))
    return cycles


@pytest.mark.parametrize("cycles", [CYCLES, _long_run()], ids=["one cycle", "six cycles"])
def test_summary_fits_a_100_column_terminal(cycles):
    """At 100 columns no header is cut ("held-o…", "forget…", "bounda…") and no cell wraps."""
    console = Console(record=True, width=100)
    print_summary(console, cycles, {"seed": 1000, "synthesized": 11345, "signal:unsolved": 2})
    text = console.export_text()
    lines = text.splitlines()
    assert "…" not in text
    assert all(len(line) <= 100 for line in lines)
    blocks = _table_blocks(lines)
    assert len(blocks) == 4  # per cycle, signals, per family, seconds per stage
    for block in blocks:
        head = block[1 : next(i for i, line in enumerate(block) if line.startswith("┡"))]
        assert len(head) == 1, f"a header wrapped onto two lines: {head}"
        body = [line for line in block if line.startswith("│")]
        # a wrapped cell continues on a line whose first cell is empty
        assert all(line.split("│")[1].strip() for line in body), "\n".join(block)
    headers = " ".join(block[1] for block in blocks)
    for name in ("held-out", "tool seq", "flag prec.", "synth/acc/dup", "overhead", "forgot",
                 "bound.", "unsolv.", "synthesize", "evaluate"):  # fmt: skip
        assert name in headers
    # the legends say what each abbreviation means
    assert "bound.: boundary" in " ".join(lines) and "synth/acc/dup: candidates" in text
    if len(cycles) > 4:
        # the per-family table keeps cycle 0 and the latest cycles, naming those left out
        family_head = blocks[2][1]
        assert "c0" in family_head and "c6" in family_head
        assert "left out to fit" in text.replace("\n", " ")


@pytest.mark.parametrize(
    "roles, kinds, says",
    [
        (
            {"synthesizer": "generator", "abstractor": "abstractor:offline"},
            {"unsolved:structure_variant": 3, "rare:window": 1},
            "task generator (3 of 4",
        ),
        (
            {"synthesizer": "variation", "abstractor": "abstractor:variation"},
            {"unsolved:variation": 2},
            "variations of the failed tasks",
        ),
        (
            {"synthesizer": "llm", "abstractor": "abstractor:llm(m)"},
            {"rare:llm": 2},
            "the LLM roles",
        ),
        # a run summary from before the switch names its abstractor
        ({"abstractor": "abstractor:offline"}, {"rare:window": 2}, "explored windows"),
    ],
)
def test_the_summary_names_the_synthesizer(roles, kinds, says):
    from coevolve.outputs.report import synthesizer_line
    from coevolve.outputs.summary import SynthesisFigures

    figures = SynthesisFigures(roles=roles, candidate_kinds=kinds, time_s=1.0)
    cycles = [CycleSummary(cycle=0), CycleSummary(cycle=1, synthesize=figures)]
    line = synthesizer_line(cycles)
    name = roles.get("synthesizer", roles["abstractor"])
    assert line is not None and line.startswith(f"synthesizer: {name}: ") and says in line
    console = Console(width=100, record=True)
    print_summary(console, cycles)
    assert "synthesizer: " in console.export_text()
    assert synthesizer_line([CycleSummary(cycle=0)]) is None
