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

    # cycle, held-out, tool seq, rollout, 4 signal kinds, flag prec., synth/acc/dup, pool,
    # loss, overhead
    assert row("1", "per cycle") == [
        "1", "50.0%", "75.0%", "37.5%", "0", "2", "1", "3", "66.7%", "5 / 2 / 1", "42",
        "1.234", "17.9%",
    ]  # fmt: skip
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
