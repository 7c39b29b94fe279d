#!/usr/bin/env bash
# The GPU check in one command: calibrate this host, profile the real models, measure
# real-size and small-model fidelity and the optimizer's pick, every result in one folder.
#
#   bash bench/gpu_check.sh OUT_DIR [--quick] [--total-s S]
#
# Needs the checkout on PYTHONPATH (this script sets it) and what `pip install simplace`
# installs. SIMPLACE_HOME is respected; unset, it is OUT_DIR/home, so nothing outside
# OUT_DIR is written. Each stage has its own time limit (a share of S seconds, default
# 480; the small models' stage, the last, also what the stages before left unused) and
# a stage that fails or runs out of time does not stop the others; each one's
# output is in OUT_DIR/NN_stage.log and its exit status in OUT_DIR/status.txt.
#
# --quick: CPU devices only, tiny models and budgets (the test suite runs it on a VM).
set -uo pipefail

usage() { echo "usage: bash bench/gpu_check.sh OUT_DIR [--quick] [--total-s S]" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT="$1"; shift
QUICK=0
TOTAL=480
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --total-s) shift; [ $# -gt 0 ] || usage; TOTAL="$1" ;;
    *) echo "gpu_check: unknown option $1" >&2; usage ;;
  esac
  shift
done
case "$TOTAL" in ''|*[!0-9]*) echo "gpu_check: --total-s takes whole seconds, got '$TOTAL'" >&2; exit 2 ;; esac

REPO="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT" || { echo "gpu_check: cannot create $OUT" >&2; exit 2; }
OUT="$(cd "$OUT" && pwd)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export SIMPLACE_HOME="${SIMPLACE_HOME:-$OUT/home}"
PY="${PYTHON:-python3}"
NAME=gpu_check
START=$SECONDS
: > "$OUT/status.txt"

# stage NAME SECONDS COMMAND...: run COMMAND with a time limit, log it, record its status.
n=0
stage() {
  local name="$1" limit="$2"; shift 2
  n=$((n + 1))
  local log; log="$OUT/$(printf '%02d' "$n")_$name.log"
  local left=$((TOTAL - (SECONDS - START)))
  if [ "$limit" -gt "$left" ]; then limit=$left; fi
  if [ "$limit" -lt 5 ]; then
    echo "$name: skipped (the total time is spent)" | tee -a "$OUT/status.txt"
    return
  fi
  echo "== $name (limit ${limit} s): $*" | tee "$log"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >> "$log" 2>&1
  local rc=$?
  local why="exit $rc"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then why="timed out after ${limit} s"; fi
  echo "$name: $why in $((SECONDS - t0)) s" | tee -a "$OUT/status.txt"
}

if [ $QUICK -eq 1 ]; then
  export JAX_PLATFORMS=cpu
  CAL=(--quick --budget-s 20)
  REAL=(mlp:64 tiny_cnn:8)
  SMALL=(--models mlp --per-model 20 --search-budget-s 1 --rounds 1 --timing-budget-s 0.2)
  FID=(--placements 8 --chunks 4 --search-budget-s 1 --repeats 2 --rounds 1)
else
  CAL=(--budget-s $((TOTAL * 15 / 100)))
  REAL=(resnet50:0 bert_base:0 transformer:0 inception_v3:0 rnnlm:0)
  SMALL=(--models mlp,tiny_cnn,rnnlm --per-model 20 --search-budget-s 2 --rounds 2 --timing-budget-s 0.5)
  FID=(--placements 8 --chunks 12 --search-budget-s 2 --repeats 3 --rounds 1)
fi

stage env 30 bash -c "nvidia-smi 2>/dev/null || echo 'no nvidia-smi'; nproc; uptime; $PY -c 'import jax, simplace; print(jax.__version__, jax.devices())'"
# The calibration: its limit leaves room for the fit after the measurement budget.
stage calibrate $((TOTAL * 25 / 100)) "$PY" -m simplace calibrate --name "$NAME" --overwrite \
  --no-progress "${CAL[@]}"
stage cost_model 20 bash -c "cp '$SIMPLACE_HOME/cost_models/$NAME.json' '$SIMPLACE_HOME/calibration/$NAME/records.jsonl' '$OUT/'"
# Real sizes: one stage per model, in order of priority, from a pool of 60% of the
# total: each may take up to twice its even share of the pool, never more than is left,
# so that one slow model cannot take all the others' time.
pool_end=$((SECONDS - START + TOTAL * 60 / 100))
per_model=$((TOTAL * 60 / 100 * 2 / ${#REAL[@]}))
for m in "${REAL[@]}"; do
  left=$((pool_end - (SECONDS - START)))
  stage "real_${m%%:*}" $((per_model < left ? per_model : left)) "$PY" \
    "$REPO/bench/fidelity_real.py" --cost-model "$NAME" --models "$m" "${FID[@]}" \
    --out-dir "$OUT" --tag "${m%%:*}"
done
# The small models: their share of the total, or more where the stages before left time
# (all that is left but the summary's few seconds): on a loaded host the stages before
# finish early and this one, compiling its placements, runs slow.
small=$((TOTAL * 12 / 100))
spare=$((TOTAL - (SECONDS - START) - 10))
stage small_models $((spare > small ? spare : small)) "$PY" "$REPO/bench/fidelity.py" --cost-model "$NAME" \
  "${SMALL[@]}" --out-dir "$OUT"
stage summary 20 bash -c "cat '$OUT'/fidelity_real_*.txt '$OUT'/fidelity_2*.txt > '$OUT/summary.txt' 2>/dev/null; cat '$OUT/status.txt' >> '$OUT/summary.txt'"
echo "gpu_check: done in $((SECONDS - START)) s; results in $OUT (summary.txt, status.txt)"
