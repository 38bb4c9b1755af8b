"""The typed figures between stages (coevolve.outputs.summary): the keys on disk stay the keys they were.

The cycles below are written key for key as graph/cycle/graph.py wrote them before the figures
were typed: CURRENT as of the commit that introduced the models, FIRST_LOOP as the first
closed loop (95d3334) did, before diagnosis, flag maps and nearest misses were recorded.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from coevolve.outputs.report import metrics_rows, overhead_share, write_report
from coevolve.outputs.summary import CycleSummary, RunSummary, SignalFigures, TrainFigures

BASELINE: dict[str, Any] = {
    "cycle": 0,
    "evaluate": {
        "success": 0.2,
        "tool_sequence": 0.3,
        "calls": 0.4,
        "episodes": 18,
        "left_out": 0,
        "by_family": {"buy_item": 0.0, "phone_lookup": 1.0},
        "tokens": 900,
        "time_s": 12.5,
    },
    "time_s": 13.0,
}

TRAIN_RESULT: dict[str, Any] = {
    "algorithm": "sft",
    "adapter_dir": "runs/x/adapters/cycle-1",
    "previous_adapter": None,
    "steps": 10,
    "examples": 40,
    "final_loss": 0.75,
    "mean_loss": 0.9,
    "mean_reward": None,
    "groups": None,
    "demonstration_steps": None,
    "train_time_s": 30.0,
    "steps_per_s": 0.33,
    "device": "cpu",
    "skipped": None,
    "resumed_from_step": None,  # added with resumable steps (training.checkpoint_every)
    "rows_by_source": {"seed": 30, "rollout": 10},  # added with auditable bench units
}

CURRENT: dict[str, Any] = {
    "cycle": 1,
    "rollout": {
        "tasks": 24,
        "seed_tasks": 20,
        "synthesized_tasks": 4,
        "episodes": 48,
        "left_out": 2,
        "success": 0.25,
        "diagnosis": {"pass": 12, "argument_mismatch": 30},
        "tokens": 5000,
        "time_s": 40.0,
    },
    "signals": {
        "flagged": 20,
        "kept": 8,
        "by_kind": {"forgetting": 0, "boundary": 6, "rare": 4, "unsolved": 10},
        "kept_by_kind": {"forgetting": 0, "boundary": 2, "rare": 2, "unsolved": 4},
        "by_family": {
            "buy_item": {
                "rollout_success": 0.0,
                "flagged": {"unsolved": 10},
                "flagged_items": 10,
                "kept": {"unsolved": 4},
                "kept_items": 4,
            },
            "phone_lookup": {
                "rollout_success": 0.9,
                "flagged": {"boundary": 6, "rare": 4},
                "flagged_items": 10,
                "kept": {"boundary": 2, "rare": 2},
                "kept_items": 4,
            },
        },
        "flag_precision": 0.5,
        "nearest_misses": 3,
        "oracle_validation": None,
        "time_s": 0.5,
    },
    "synthesize": {
        "flagged": 8,
        "explored": 8,
        "candidates": 20,
        "judged_ok": 12,
        "at_frontier": None,  # added with the frontier check (None: it did not run)
        "duplicates": 2,
        "accepted": 10,
        "crashed": 0,
        "by_signal": {"unsolved": 6, "rare": 4},
        "by_family": {"buy_item": 6, "phone_lookup": 4},
        # added with issue 88: by the family of the parent, then the tool sequence
        "by_parent_family": {
            "buy_item": {"search_products>add_to_cart>checkout": 6},
            "phone_lookup": {"find_contact": 4},
        },
        "by_calls": {"1": 4, "2": 6},  # added with the teacher and the composer
        "candidate_kinds": {},
        "reply_errors": {},
        "tokens": {"prompt": 9000, "completion": 400},  # added with the teacher's cost
        "top_rejections": {"replay failed": 5, "judge: wrong tool": 3},
        "rejections": 10,
        "roles": {"summarizer": "offline", "judge": "offline"},
        "removed_on_resume": 0,
        "time_s": 60.0,
    },
    "pool": {"added": 10, "seed": 100, "synthesized": 14, "size": 114, "time_s": 0.1},
    "train": {
        **TRAIN_RESULT,
        "world_size": 1,  # added with launched training steps (DDP); older summaries lack it
        "failure": None,
        "failure_adapter": None,
        "hard_negatives": {},
        "stage_time_s": 35.0,
    },
    "evaluate": {**BASELINE["evaluate"], "success": 0.3, "time_s": 11.0},
}

FIRST_LOOP: dict[str, Any] = {
    "cycle": 1,
    "rollout": {
        "tasks": 24,
        "seed_tasks": 24,
        "synthesized_tasks": 0,
        "episodes": 48,
        "success": 0.25,
        "tokens": 5000,
        "time_s": 40.0,
    },
    "signals": {
        "flagged": 20,
        "kept": 8,
        "by_kind": {"forgetting": 0, "boundary": 6, "rare": 4},
        "time_s": 0.5,
    },
    "synthesize": {
        "flagged": 8,
        "explored": 8,
        "candidates": 20,
        "judged_ok": 12,
        "duplicates": 2,
        "accepted": 10,
        "by_signal": {"rare": 10},
        "reply_errors": {"body": 2},
        "top_rejections": {"replay failed": 5},
        "roles": {"summarizer": "offline"},
        "removed_on_resume": 0,
        "time_s": 60.0,
    },
    "pool": {"added": 10, "seed": 100, "synthesized": 10, "size": 110, "time_s": 0.1},
    "train": {**TRAIN_RESULT, "stage_time_s": 35.0},
    "evaluate": {**BASELINE["evaluate"], "success": 0.3, "time_s": 11.0},
}


def test_a_cycle_summary_round_trips_key_for_key():
    for written in (BASELINE, CURRENT):
        summary = CycleSummary.model_validate(written)
        assert summary.model_dump() == written
        assert json.loads(summary.model_dump_json()) == written
        assert CycleSummary.model_validate_json(summary.model_dump_json()) == summary
    cycle = CycleSummary.model_validate(CURRENT)
    assert cycle.signals is not None and cycle.signals.by_family["buy_item"].kept_items == 4
    assert cycle.train is not None and cycle.train.final_loss == 0.75


def test_stages_that_did_not_run_are_left_out_of_the_dump():
    baseline = CycleSummary.model_validate(BASELINE)
    assert baseline.rollout is None and baseline.train is None
    assert set(baseline.model_dump()) == {"cycle", "evaluate", "time_s"}
    # Missing figures inside a stage are not left out: None is a value there.
    assert (
        SignalFigures.model_validate(FIRST_LOOP["signals"]).model_dump()["flag_precision"] is None
    )


def test_a_summary_of_the_first_closed_loop_still_loads():
    cycle = CycleSummary.model_validate(FIRST_LOOP)
    assert cycle.rollout is not None and cycle.rollout.diagnosis == {}
    assert cycle.signals is not None and cycle.signals.by_family == {}
    assert cycle.signals.flag_precision is None and cycle.signals.nearest_misses == 0
    assert cycle.synthesize is not None and cycle.synthesize.crashed == 0
    assert cycle.train is not None and cycle.train.hard_negatives == {}
    row = metrics_rows([cycle])[0]
    assert row["flag_precision"] is None and row["flags_by_family"] == {}
    assert row["accepted"] == 10 and row["pool_size"] == 110 and row["train_loss"] == 0.75


def test_unknown_keys_are_ignored_and_missing_figures_refused():
    newer = {**CURRENT, "rollout": {**CURRENT["rollout"], "a_later_figure": 1}}
    newer["train"] = {**CURRENT["train"], "a_later_train_figure": 2}
    assert CycleSummary.model_validate(newer) == CycleSummary.model_validate(CURRENT)
    # a cycle not evaluated (evaluation.every) has no evaluate figures, and says so
    assert CycleSummary.model_validate({"cycle": 1, "rollout": CURRENT["rollout"]}).evaluate is None
    with pytest.raises(ValidationError, match="success"):
        CycleSummary.model_validate({**CURRENT, "rollout": {"tasks": 1, "time_s": 1.0}})


def test_train_figures_keep_the_hard_negative_steps():
    failure = {**TRAIN_RESULT, "algorithm": "dpo", "adapter_dir": "runs/x/adapters/failure-cycle-1"}
    shares = {"target": {"share": 0.5, "episodes": 48}, "failure_pairs": 3}
    figures = TrainFigures.model_validate(
        {**TRAIN_RESULT, "failure": failure, "hard_negatives": shares, "stage_time_s": 50.0}
    )
    assert figures.failure is not None and figures.failure.algorithm == "dpo"
    assert figures.model_dump()["hard_negatives"] == shares


def test_stage_seconds_and_overhead_read_the_typed_figures():
    cycle = CycleSummary.model_validate(CURRENT)
    assert cycle.stage_seconds() == {
        "rollout": 40.0,
        "signals": 0.5,
        "synthesize": 60.0,
        "pool": 0.1,
        "train": 35.0,  # the whole stage, not the step's train_time_s
        "evaluate": 11.0,
    }
    # Outside generation (rollout 40 + evaluate 11) and the step (30): 146.6 - 81 seconds.
    assert overhead_share(cycle) == pytest.approx((146.6 - 81.0) / 146.6)
    assert CycleSummary.model_validate(BASELINE).stage_seconds() == {"evaluate": 12.5}
    assert overhead_share(CycleSummary.model_validate(BASELINE)) is None


def test_metrics_rows_flatten_the_typed_figures():
    rows = metrics_rows([CycleSummary.model_validate(c) for c in (BASELINE, CURRENT)])
    assert [row["cycle"] for row in rows] == [0, 1]
    assert rows[0]["rollout_success"] is None and rows[0]["signals"] == {}
    assert rows[0]["stage_time_s"] == {"evaluate": 12.5}
    first = rows[1]
    assert first["heldout_success"] == 0.3 and first["heldout_by_family"]["phone_lookup"] == 1.0
    assert first["signals"] == CURRENT["signals"]["by_kind"]
    assert first["flags_by_family"] == CURRENT["signals"]["by_family"]
    assert first["diagnosis"] == {"pass": 12, "argument_mismatch": 30}
    assert (first["candidates"], first["accepted"], first["duplicates"]) == (20, 10, 2)
    assert (first["pool_size"], first["train_steps"], first["train_loss"]) == (114, 10, 0.75)


def test_summary_json_keeps_its_keys_and_reads_back(tmp_path):
    cycles = [CycleSummary.model_validate(c) for c in (BASELINE, CURRENT)]
    paths = write_report(tmp_path, cycles, None)
    saved = json.loads(paths["summary"].read_text())
    assert saved == {"cycles": [BASELINE, CURRENT], "pool": {}}
    assert RunSummary.model_validate_json(paths["summary"].read_text()).cycles == cycles
    rows = [json.loads(line) for line in paths["metrics"].read_text().splitlines()]
    assert rows == json.loads(json.dumps(metrics_rows(cycles)))
