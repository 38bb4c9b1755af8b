#!/usr/bin/env bash
# Issue 85: variations of the failed task at N = 100. Arms static, coevolve-variation,
# random-variation and coevolve-oracle, every unit at one commit (a worktree of it), on
# validation (144 tasks, seeds 0 and 1: the tuning runs) or held-out (216 tasks, every
# cycle: the verdict). A 2-core machine runs it in pieces over several sessions, and a
# session keeps nothing outside the repo, so this script rebuilds what a piece needs and
# copies each finished unit into the repo, where the next piece finds it and skips it.
#
#   scripts/verdict-variation-n100.sh setup                   # worktree at $VERDICT_COMMIT
#   scripts/verdict-variation-n100.sh run SPLIT ARMS SEEDS    # e.g. run validation static 0,1
#   scripts/verdict-variation-n100.sh collect SPLIT           # finished units -> docs/figures
#   scripts/verdict-variation-n100.sh report SPLIT [SEEDS]    # the report over collected units
#
# SPLIT is validation or heldout. Run from the repo root after `make setup`; the worktree
# uses this checkout's .venv with its own code first on the path (a unit records the
# fingerprint of the code it ran). Extra `bench learning` options (a tuning run's
# --arm-set, say) go in $BENCH_ARGS, the same for every piece of one report.
#
# The verdict runs at ce50660, where the validation units ran. Its static and
# coevolve-oracle units are the compose verdict's, at b34184c (docs/figures/
# bench-variation-n100/units holds copies): the quick bench's stage files of those arms
# are identical at the two commits (bench/stage_files_identical.py), so they count with
#   BENCH_ARGS="--accept-code 8e741cb61640ee17 \
#     --arm-set coevolve-oracle:pool.synthesized_weight=1.0 [the variation arms' tuned --arm-set]"
# and only coevolve-variation and random-variation run.
# Never edit this file while a piece runs: bash reads it as it goes.
set -euo pipefail

COMMIT=${VERDICT_COMMIT:?set VERDICT_COMMIT to the commit every unit runs at}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORKTREE=${VERDICT_WORKTREE:-$REPO/../wt-variation-$COMMIT}
PATHS=${VERDICT_PATHS:-$REPO/../wt-paths/variation-$COMMIT}
PY=$REPO/.venv/bin/python
CONFIG=configs/bench-lowresource-n100.yaml
ARMS=static,coevolve-variation,random-variation,coevolve-oracle
read -r -a EXTRA <<< "${BENCH_ARGS:-}"

split_settings() {
    case $1 in
    validation) OUT=runs/bench-variation-n100-validation
        UNITS_DIR=$REPO/docs/figures/bench-variation-n100-validation/units
        SPLIT_SET=(--set evaluation.split=validation) ;;
    heldout) OUT=runs/bench-variation-n100
        UNITS_DIR=$REPO/docs/figures/bench-variation-n100/units
        SPLIT_SET=() ;;
    *) echo "SPLIT is validation or heldout, not '$1'" >&2; exit 2 ;;
    esac
}

in_worktree() {
    cd "$WORKTREE"
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONPATH=$PATHS HF_HUB_OFFLINE=1 \
        TRANSFORMERS_OFFLINE=1 ANONYMIZED_TELEMETRY=False "$PY" -m coevolve "$@"
}

case ${1:-} in
setup)
    [ -d "$WORKTREE" ] || git -C "$REPO" worktree add --detach "$WORKTREE" "$COMMIT"
    mkdir -p "$PATHS"
    ln -sfn "$(cd "$WORKTREE" && pwd)" "$PATHS/coevolve"
    for split in validation heldout; do
        split_settings "$split"
        mkdir -p "$WORKTREE/$OUT/units"
        # Units already collected count as finished: the bench skips them.
        cp -n "$UNITS_DIR"/* "$WORKTREE/$OUT/units/" 2>/dev/null || true
    done
    echo "worktree $WORKTREE at $(git -C "$WORKTREE" rev-parse --short HEAD)"
    ;;
run)
    split_settings "$2"
    in_worktree bench learning --config "$CONFIG" --arms "$3" --seed-list "$4" --out "$OUT" \
        "${SPLIT_SET[@]}" "${EXTRA[@]}"
    ;;
collect)
    split_settings "$2"
    mkdir -p "$UNITS_DIR"
    cp -n "$WORKTREE/$OUT"/units/* "$UNITS_DIR/" 2>/dev/null || true
    ls "$UNITS_DIR"
    ;;
report)
    split_settings "$2"
    in_worktree bench learning --config "$CONFIG" --arms "$ARMS" \
        --seed-list "${3:-0,1}" --out "$OUT" --report-only --json "${SPLIT_SET[@]}" "${EXTRA[@]}"
    ;;
*)
    sed -n 2,18p "$0"
    exit 2
    ;;
esac
