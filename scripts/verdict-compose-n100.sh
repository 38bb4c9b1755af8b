#!/usr/bin/env bash
# Issue 71's verdict (docs/compose.md): static, coevolve-oracle, coevolve-compose and
# random-compose at N = 100, held-out (216 tasks, every cycle), seeds 0-7, every unit at
# one commit. A 2-core machine runs it in pieces over several sessions, and a session
# keeps nothing outside the repo, so this script rebuilds what a piece needs and copies
# each finished unit into the repo, where the next piece finds it and skips it.
#
#   scripts/verdict-compose-n100.sh setup            # worktree at the verdict's commit
#   scripts/verdict-compose-n100.sh writer           # teach the task writer (cached)
#   scripts/verdict-compose-n100.sh serve            # the writer on :8011 (background)
#   scripts/verdict-compose-n100.sh check-writer     # weights differ: does it write the same?
#   scripts/verdict-compose-n100.sh run ARMS SEEDS   # e.g. run static,coevolve-oracle 0,1
#   scripts/verdict-compose-n100.sh collect          # finished units -> $UNITS_DIR
#   scripts/verdict-compose-n100.sh report           # the report over every collected unit
#
# Run from the repo root after `make setup`; the worktree uses this checkout's .venv with
# its own code first on the path (a unit records the fingerprint of the code it ran).
# Never edit this file while a piece runs: bash reads it as it goes, and a running `run`
# went on, when its unit ended, to read a line of a changed file from the middle.
set -euo pipefail

COMMIT=${VERDICT_COMMIT:-b34184c}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORKTREE=${VERDICT_WORKTREE:-$REPO/../wt-v71}
PATHS=${VERDICT_PATHS:-$REPO/../wt-paths/v71}
UNITS_DIR=$REPO/docs/figures/bench-compose-n100/units
OUT=runs/bench-compose-n100
PY=$REPO/.venv/bin/python
CONFIG=configs/bench-lowresource-n100.yaml
WRITER_SHA256=fd2457fb2a409c42db6c065a39d863d6570d6228a954f38d4c18965ccb83eb1d
# Other weights that passed check-writer over every compose unit collected by then
# (docs/compose.md): 2026-12-07, 178 tasks, on an AVX-512/AMX machine.
WRITER_CHECKED=(126bed51385ea6a247cab6cd2574097e6d1de5e70367413134901336511ca68c)
# The tuned shares (docs/compose.md, "Tuning for the verdict"): every piece passes the
# same items, so the final --report-only counts every unit.
ARM_SET=(--arm-set random-compose:pool.synthesized_weight=0.3
         --arm-set coevolve-oracle:pool.synthesized_weight=1.0)
WRITER=(--set endpoints.writer.base_url=http://127.0.0.1:8011/v1
        --set endpoints.writer.model=runs/writer-n100 --set endpoints.writer.max_tokens=64
        --set endpoints.writer.temperature=0.0 --set endpoints.writer.concurrency=2
        --set endpoints.writer.timeout_s=600)

# The weights of the writer linked in the worktree.
writer_weights() {
    echo "$(readlink -f "$WORKTREE/runs/writer-n100")/model.safetensors"
}

# Whether the writer linked in the worktree may write a compose unit: the verdict's
# weights, weights checked in an earlier session, or weights check-writer passed here.
writer_counts() {
    local sum
    sum=$(sha256sum "$(writer_weights)" | cut -d' ' -f1)
    [[ $sum == "$WRITER_SHA256" || " ${WRITER_CHECKED[*]} " == *" $sum "* ]] ||
        sha256sum --check --quiet "$WORKTREE/logs/writer-checked.sha256" &>/dev/null
}

in_worktree() {
    cd "$WORKTREE"
    OMP_NUM_THREADS=1 PYTHONPATH=$PATHS HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        ANONYMIZED_TELEMETRY=False "$PY" -m coevolve "$@"
}

case ${1:-} in
setup)
    [ -d "$WORKTREE" ] || git -C "$REPO" worktree add --detach "$WORKTREE" "$COMMIT"
    mkdir -p "$PATHS" "$WORKTREE/logs" "$WORKTREE/$OUT/units"
    ln -sfn "$(cd "$WORKTREE" && pwd)" "$PATHS/coevolve"
    # Units already collected count as finished: the bench skips them.
    cp -n "$UNITS_DIR"/* "$WORKTREE/$OUT/units/" 2>/dev/null || true
    echo "worktree $WORKTREE at $(git -C "$WORKTREE" rev-parse --short HEAD)"
    ;;
writer)
    dir=$(in_worktree writer "$CONFIG" --path | tail -1)
    ln -sfn "$dir" "$WORKTREE/runs/writer-n100"
    # The compose arms' units count as one verdict only if every session's writer is the
    # same model: the first session's weights hash, checked each time it is rebuilt. Another
    # CPU rounds the same training differently (an AVX-512 machine did): then `check-writer`
    # decides, by what the writer writes.
    if writer_counts; then
        echo "writer $dir (weights the verdict's or checked)"
    else
        echo "writer $dir: weights differ from the verdict's; serve it, then run check-writer" \
            "before any compose unit" >&2
        exit 1
    fi
    ;;
serve)
    in_worktree serve configs/writer.yaml --endpoint writer \
        --set endpoints.writer.model=runs/writer-n100 > "$WORKTREE/logs/writer-serve.log" 2>&1 &
    echo "serving (log: $WORKTREE/logs/writer-serve.log); check: curl localhost:8011/v1/models"
    ;;
check-writer)
    # Every collected compose unit's accepted tasks written again, clause by clause, by the
    # writer served now (bench/writer_replay_check.py): the same text for every task, or no
    # compose unit runs. A pass is kept beside the weights it checked.
    shopt -s nullglob
    collected=("$UNITS_DIR"/*compose-seed*.tasks.jsonl)
    if [ ${#collected[@]} -eq 0 ]; then
        echo "no compose unit collected in $UNITS_DIR: nothing to check the writer against" >&2
        exit 1
    fi
    for tasks in "${collected[@]}"; do
        name=$(basename "$tasks" .tasks.jsonl)
        (cd "$WORKTREE" && OMP_NUM_THREADS=1 PYTHONPATH=$PATHS HF_HUB_OFFLINE=1 \
            "$PY" "$REPO/bench/writer_replay_check.py" "$tasks" --strict) |
            tee "$WORKTREE/logs/writer-check-$name.log" | tail -n 1
    done
    sha256sum "$(writer_weights)" > "$WORKTREE/logs/writer-checked.sha256"
    echo "the writer served now writes every collected compose task as its unit did"
    ;;
run)
    if [[ $2 == *compose* ]] && ! writer_counts; then
        echo "the writer is neither the verdict's weights nor passed check-writer" >&2
        exit 1
    fi
    in_worktree bench learning --config "$CONFIG" --arms "$2" --seed-list "$3" --out "$OUT" \
        "${ARM_SET[@]}" "${WRITER[@]}"
    ;;
collect)
    mkdir -p "$UNITS_DIR"
    cp -n "$WORKTREE/$OUT"/units/* "$UNITS_DIR/" 2>/dev/null || true
    ls "$UNITS_DIR"
    ;;
report)
    in_worktree bench learning --config "$CONFIG" \
        --arms static,coevolve-oracle,coevolve-compose,random-compose \
        --seed-list "${2:-0,1,2,3,4,5,6,7}" --out "$OUT" --report-only --json \
        "${ARM_SET[@]}" "${WRITER[@]}"
    ;;
*)
    sed -n 2,19p "$0"
    exit 2
    ;;
esac
