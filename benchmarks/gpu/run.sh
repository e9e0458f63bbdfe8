#!/usr/bin/env bash
# One command for the H200 (fits a 10-minute limit): the GPU ops, fast-model, fast-Program and oracle-diff tests
# and the e2e server tests on the fast Program, then the fast-path benchmark
# (bandwidth, decode eager/graphs, prefill, floors, peak memory), then HF transformers (+fla) on the same shapes
# with a side-by-side table. Each part may fail without stopping the next;
# the benchmark prints its table last and writes raw JSON to $OUT when set. Nothing is downloaded: carry .whl
# (benchmarks/gpu/fetch_wheels.sh) and .carry/default.ninfer for the e2e tests and fla.
#
#   bash benchmarks/gpu/run.sh            # env: PYTHON (default python3), OUT, BENCH_MODELS, TEST_TIMEOUT_S,
#                                         #      HF_BUDGET_S (default 120; 0 skips HF), HF_MODELS
set -u
cd "$(dirname "$0")/../.."
PY="${PYTHON:-$(command -v python3 || command -v python)}"  # the GPU image's torch lives in python3
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)
TOTAL_S=565  # leave headroom under the 600 s limit for start-up and result transfer
# wheels the image lacks (benchmarks/gpu/fetch_wheels.sh; the call carries .whl): server, openai client, xgrammar, fla
if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH || echo "wheel install failed"
fi
# the carried embedded default model: the tests link it into their cache instead of building it
[ -f .carry/default.ninfer ] && export NINFER_TEST_DEFAULT_MODEL="$PWD/.carry/default.ninfer"

# the e2e tests run `ninfer serve --program fast` (they need the carried wheels)
E2E="tests/e2e/test_openai_client.py tests/e2e/test_bench.py tests/e2e/test_disconnect_storm.py"
"$PY" -c "import fastapi, uvicorn, openai, xgrammar, platformdirs" 2>/dev/null \
    || { E2E=""; echo "no server packages (carry .whl): e2e tests left out"; }
echo "== GPU tests: tests/ops tests/fast_model tests/fast_program tests/oracle/test_diff.py $E2E"
LOG=$(mktemp)
NINFER_TEST_DEVICE=cuda timeout "${TEST_TIMEOUT_S:-220}" "$PY" -m pytest tests/ops tests/fast_model tests/fast_program tests/oracle/test_diff.py $E2E -q \
    -p no:cacheprovider 2>&1 | tee "$LOG" | tail -40
RC=${PIPESTATUS[0]}
SUMMARY="rc=$RC: $(grep -E '(passed|failed|error)' "$LOG" | tail -1)"
[ "$RC" = 124 ] && SUMMARY="rc=124: timed out after ${TEST_TIMEOUT_S:-220}s; $(tail -1 "$LOG")"
[ -n "${OUT:-}" ] && mkdir -p "$OUT" && cp "$LOG" "$OUT/pytest_gpu.log"
rm -f "$LOG"

HF_S="${HF_BUDGET_S:-120}"  # seconds kept for the HF transformers (+fla) baseline after the benchmark; 0 skips it
LEFT=$(( TOTAL_S - ($(date +%s) - START) ))
DEADLINE=$(( LEFT - 25 - HF_S ))
echo "== benchmark (${DEADLINE}s budget)"
if [ "$DEADLINE" -gt 30 ]; then
    NINFER_PYTEST_SUMMARY="$SUMMARY" timeout $(( LEFT - 5 - HF_S )) "$PY" benchmarks/gpu/bench_fast.py \
        --models "${BENCH_MODELS:-0.8B,9B,35B-A3B}" --deadline-s "$DEADLINE" ${OUT:+--out "$OUT"}
    BRC=$?
    [ "$BRC" != 0 ] && echo "benchmark exited with rc=$BRC (partial results, if any, are in \$OUT/bench_fast.json)"
else
    echo "no time left for the benchmark; GPU tests: $SUMMARY"
fi

# HF transformers on the same shapes (fla kernels when the carried wheels import), then the side-by-side table
LEFT=$(( TOTAL_S - ($(date +%s) - START) ))
HF_DEADLINE=$(( HF_S < LEFT - 15 ? HF_S : LEFT - 15 ))
if [ "$HF_S" -gt 0 ] && [ "$HF_DEADLINE" -gt 30 ]; then
    echo "== HF transformers baseline (${HF_DEADLINE}s budget)"
    timeout $(( HF_DEADLINE + 10 )) "$PY" benchmarks/gpu/bench_hf.py \
        --models "${HF_MODELS:-${BENCH_MODELS:-0.8B,9B,35B-A3B}}" --deadline-s "$HF_DEADLINE" ${OUT:+--out "$OUT"} \
        || echo "HF baseline exited with rc=$? (partial results, if any, are in \$OUT/bench_hf.json)"
elif [ "$HF_S" -gt 0 ]; then
    echo "no time left for the HF baseline"
fi
