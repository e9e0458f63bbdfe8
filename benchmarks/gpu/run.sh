#!/usr/bin/env bash
# The H200 script: GPU tests, benchmarks through the Engine and of the model executor, the HF transformers (+fla)
# baseline on the same shapes, and op micro-benchmarks with a per-kernel profile. Each part fits one 10-minute device
# call; run them in separate calls, back to back (a warm machine is reused). Each step may fail without stopping the
# next; every benchmark prints its table last and writes raw JSON to $OUT when set. Nothing is downloaded: carry
# .whl (benchmarks/gpu/fetch_wheels.sh) and .carry/default.ninfer for the e2e tests and fla.
#
#   bash benchmarks/gpu/run.sh tests    # ops, fast model, fast Program (+ property harness), oracle diff, e2e serve
#   bash benchmarks/gpu/run.sh engine   # bench_engine.py (with idle between decode steps, async off/on) then bench_fast.py
#   bash benchmarks/gpu/run.sh hf       # bench_hf.py, then report.py's side-by-side table over $OUT
#   bash benchmarks/gpu/run.sh micro    # bench_fast.py triton vs triton-fused (0.8B, 35B-A3B), bench_gemv.py, bench_ops.py,
#                                       # profile_fast.py (each in the time the ones before left)
#   bash benchmarks/gpu/run.sh profile  # profile_graphs.py: per-kernel tables inside the prefill graphs (buckets 64 and
#                                       # 512, BENCH_MODELS default 0.8B,9B), the B=1 decode graph and the MTP round's
#                                       # graphs at B=1 (SPEC_MODELS, default 9B), each beside its eager body
#   bash benchmarks/gpu/run.sh moe      # the MoE block's GPU tests, then bench_moe.py: today's path vs moe_decode per B
#                                       # at 35B-A3B with the floor and a config sweep (< 4 min)
#   bash benchmarks/gpu/run.sh llamacpp # bench_llamacpp.py: llama.cpp's CUDA build (carried source), 0.8B and 9B
#   bash benchmarks/gpu/run.sh spec     # bench_spec.py: MTP k=3 with forced acceptance through the Engine (~240 s)
#   bash benchmarks/gpu/run.sh dflash   # bench_spec.py --method dflash: blocks 8 and 16, 9B and 35B-A3B (~400 s)
#   bash benchmarks/gpu/run.sh agent    # bench_agent.py: issue 10's agent benchmark, 9B, in-process server (<= 240 s)
#   bash benchmarks/gpu/run.sh serve    # bench_serve.py: `ninfer bench serve` against a server process over the fast
#                                       # Program, 9B and 0.8B, concurrency 1, 4, 8 (TTFT/TPOT/ITL percentiles)
#   bash benchmarks/gpu/run.sh quant    # bench_quant.py: 9B, 35B-A3B in bf16, fp8, q4, nvfp4 through the Engine (~5 min)
#   bash benchmarks/gpu/run.sh qgemv    # bench_qgemv.py: the quantized decode GEMV per 9B projection vs bf16 (< 4 min)
#   bash benchmarks/gpu/run.sh pp       # bench_pp.py: pipeline stages vs one stage, 9B and 35B-A3B (decode B = 1..8,
#                                       # prefill 8192, KV capacity, one 32k sequence); PP_DEVICES (default 0,1 with
#                                       # two GPUs, else 0,0: both ranks on one GPU)
#   bash benchmarks/gpu/run.sh vision   # vision GPU tests (op, fast tower, fast Program vs reference) + bench_vision.py
#                                       # (the tower alone, then TTFT through the Engine on the 9B shape; < 3 min)
#   bash benchmarks/gpu/run.sh spec:70 dflash:100 vision:90   # several parts in one call, each PART:SECONDS its own
#                                       # budget (PART_BUDGET_S where a part names none); OUT gets one folder a part,
#                                       # and with engine beside llamacpp or hf, report.py --peers prints them side by side
#   env: PYTHON (default python3), OUT, BENCH_MODELS, MICRO_MODELS, SPEC_MODELS, TEST_PATHS, SERIAL_TEST_PATHS, PYTEST_WORKERS, TEST_TIMEOUT_S,
#        PROFILE_RECIPES (profile: quantized recipes profiled too, e.g. fp8,q4), BENCH_ENGINE_PARTS (engine: bench_engine's parts, e.g. decode,itl), PART_BUDGET_S (default 560), VISION_BENCH_ONLY (1: the vision part without its tests), SPEC_DRAFT_VOCAB (spec
#        and dflash: the backend's draft_vocab_size), DFLASH_BLOCKS (dflash: the block sizes, default 16,8), GDN_VERIFY
#        (spec and dflash: "positions" runs the verify pass's GDN recurrence per block position, "blocks" the default),
#        SPEC_BATCHES (spec and dflash: the batch sizes, default 1,2,4,8), SPEC_PROFILE_HOST (dflash: 1 adds the
#        cProfile run of the host's share at the largest B), SPEC_METHOD (profile: the round graphs' backend, mtp,
#        dflash or dflash2), PROFILE_MODELS (profile: the models whose prefill and decode graphs are profiled, default
#        BENCH_MODELS; empty: only the round graphs), QGEMV_VARIANTS / QGEMV_SHAPES (qgemv: bench_qgemv's
#        --variants, e.g. fp8,fp8row, and --shapes), SPEC_DRAFT_QUANT (spec: fp8, the MTP head's FP8 draft weights)
set -u
cd "$(dirname "$0")/../.."
PY="${PYTHON:-$(command -v python3 || command -v python)}"  # the GPU image's torch lives in python3
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)
TOTAL_S="${PART_BUDGET_S:-560}"  # headroom under the 600 s limit for start-up and result transfer (one part)
MODELS="${BENCH_MODELS:-0.8B,9B,35B-A3B}"
left() { echo $(( TOTAL_S - ($(date +%s) - START) )); }
# seconds for the next step: at most $1, and what is left less 5
capped() { local l=$(( $(left) - 5 )); echo $(( l < 1 ? 1 : (l < $1 ? l : $1) )); }
# wheels the image lacks (benchmarks/gpu/fetch_wheels.sh; the call carries .whl): server, openai client, xgrammar, fla
if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH || echo "wheel install failed"
fi
# the carried embedded default model: the tests link it into their cache instead of building it
[ -f .carry/default.ninfer ] && export NINFER_TEST_DEFAULT_MODEL="$PWD/.carry/default.ninfer"
[ -n "${OUT:-}" ] && mkdir -p "$OUT"

run_tests() {
    # the e2e tests run `ninfer serve --program fast` (they need the carried wheels)
    local e2e="tests/e2e/test_openai_client.py tests/e2e/test_vision_client.py tests/e2e/test_bench.py
        tests/e2e/test_disconnect_storm.py"
    "$PY" -c "import fastapi, uvicorn, openai, xgrammar, platformdirs" 2>/dev/null \
        || { e2e=""; echo "no server packages (carry .whl): e2e tests left out"; }
    local paths="${TEST_PATHS:-tests/ops tests/fast_model tests/fast_program tests/oracle/test_diff.py
        tests/oracle/test_spec_diff.py}" p kept=""
    # one missing path makes pytest run nothing at all (seventeenth session): leave it out, loudly
    for p in $paths; do
        if [ -e "${p%%::*}" ]; then kept="$kept $p"; else echo "MISSING test path (left out): $p"; fi
    done
    paths="$kept"
    # each of these plans with a share of the whole device (vLLM's gpu_memory_utilization), so two at once would
    # not fit: they run one at a time after the rest
    local serial="${SERIAL_TEST_PATHS:-tests/fast_program/test_pipeline_gpu.py $e2e}" workers=""
    # PYTEST_WORKERS=N: the rest in N processes (pytest-xdist, in the GPU image), one file per process
    [ -n "${PYTEST_WORKERS:-}" ] && "$PY" -c "import xdist" 2>/dev/null \
        && workers="-n $PYTEST_WORKERS --dist loadfile"
    local ignore="" f
    for f in $serial; do ignore="$ignore --ignore=$f"; done
    echo "== GPU tests: $paths${workers:+ ($workers)}, then $serial"
    local log="${OUT:-/tmp}/pytest_gpu.log"
    # shellcheck disable=SC2086
    # SIGINT at the limit: pytest stops and still prints which tests failed so far
    NINFER_TEST_DEVICE=cuda timeout -s INT -k 20 "${TEST_TIMEOUT_S:-$(( $(left) - 10 ))}" "$PY" -m pytest $paths $ignore -q \
        $workers -p no:cacheprovider --durations=15 > "$log" 2>&1
    echo "pytest rc=$?"
    tail -40 "$log"
    [ -z "${serial// }" ] && return
    # shellcheck disable=SC2086
    NINFER_TEST_DEVICE=cuda timeout -s INT -k 20 $(( $(left) - 5 )) "$PY" -m pytest $serial -q -p no:cacheprovider \
        --durations=5 > "${log%.log}_serial.log" 2>&1
    echo "pytest (serial) rc=$?"
    tail -20 "${log%.log}_serial.log"
}

run_engine() {
    echo "== benchmark through the Engine"
    timeout $(( $(left) * 6 / 10 )) "$PY" benchmarks/gpu/bench_engine.py --models "$MODELS" \
        --deadline-s $(( $(left) * 6 / 10 - 10 )) ${OUT:+--out "$OUT"} || echo "bench_engine rc=$?"
    echo "== benchmark of the model executor"
    timeout $(( $(left) - 5 )) "$PY" benchmarks/gpu/bench_fast.py --models "$MODELS" \
        --deadline-s $(( $(left) - 20 )) ${OUT:+--out "$OUT"} || echo "bench_fast rc=$?"
}

run_hf() {
    echo "== HF transformers baseline"
    timeout $(( $(left) - 5 )) "$PY" benchmarks/gpu/bench_hf.py --models "$MODELS" --deadline-s $(( $(left) - 20 )) \
        ${OUT:+--out "$OUT"} || echo "bench_hf rc=$?"
}

run_micro() {
    # first the opt-in "triton-fused" table (fused decode GEMVs; on 35B-A3B also the moe_decode MoE block) against
    # the default one, executor and graphs, in the same call; 35B-A3B needs ~110 s a table
    echo "== executor under both op tables, then op micro-benchmarks and per-kernel profile"
    timeout "$(capped 330)" "$PY" benchmarks/gpu/bench_fast.py --models "${MICRO_MODELS:-0.8B,35B-A3B}" \
        --kernels triton,triton-fused --deadline-s 320 ${OUT:+--out "$OUT/fused"} || echo "bench_fast fused rc=$?"
    timeout "$(capped 150)" "$PY" benchmarks/gpu/bench_gemv.py || echo "bench_gemv rc=$?"
    timeout "$(capped 150)" "$PY" benchmarks/gpu/bench_ops.py || echo "bench_ops rc=$?"
    timeout "$(capped 600)" "$PY" benchmarks/gpu/profile_fast.py --models "$MODELS" ${OUT:+--out "$OUT"} \
        || echo "profile_fast rc=$?"
}

run_profile() {
    # issue 14: where the graphed prefill piece's and the speculative round's fixed costs go (docs/performance.md)
    echo "== kernels inside the prefill, decode and ${SPEC_METHOD:-mtp} round graphs"
    timeout $(( $(left) - 5 )) "$PY" benchmarks/gpu/profile_graphs.py --models "${PROFILE_MODELS-${BENCH_MODELS:-0.8B,9B}}" \
        --spec-models "${SPEC_MODELS-9B}" --spec-method "${SPEC_METHOD:-mtp}" --recipes "${PROFILE_RECIPES:-}" \
        --deadline-s $(( $(left) - 20 )) ${OUT:+--out "$OUT"} || echo "profile_graphs rc=$?"
}

run_moe() {
    # issue 14: the MoE block at decode. The op and the fused table's MoE parity and launch tests first (a compile
    # failure shows there), then the benchmark
    echo "== MoE block at decode: GPU tests, then today's path vs moe_decode at 35B-A3B"
    NINFER_TEST_DEVICE=cuda timeout "$(capped 150)" "$PY" -m pytest tests/ops/test_moe_decode.py tests/ops/test_moe.py \
        "tests/fast_model/test_model.py::test_moe_prefill_and_decode_match_reference" \
        "tests/fast_model/test_launches.py::test_moe_decode_step_launches_per_layer" \
        "tests/fast_model/test_launches.py::test_graph_capture_takes_each_batch_sizes_moe_path" -q -p no:cacheprovider \
        || echo "moe tests rc=$?"
    timeout "$(capped 400)" "$PY" benchmarks/gpu/bench_moe.py --deadline-s $(( $(capped 400) - 10 )) \
        ${OUT:+--out "$OUT"} || echo "bench_moe rc=$?"
}

run_spec() {
    echo "== speculative decoding with forced acceptance, through the Engine"
    local budget=$(left)
    timeout $(( budget - 5 )) "$PY" benchmarks/gpu/bench_spec.py --models "$MODELS" --deadline-s $(( budget - 20 )) \
        ${OUT:+--out "$OUT"} ${SPEC_BATCHES:+--batches "$SPEC_BATCHES"} ${SPEC_DRAFT_VOCAB:+--draft-vocab "$SPEC_DRAFT_VOCAB"} ${GDN_VERIFY:+--gdn-verify "$GDN_VERIFY"} \
        ${SPEC_DRAFT_QUANT:+--draft-quant "$SPEC_DRAFT_QUANT"} || echo "bench_spec rc=$?"
}

run_dflash() {
    # issue 12: DFlash blocks 8 and 16 at 9B and 35B-A3B (a drafter of the published geometry), forced acceptance;
    # with SPEC_PROFILE_HOST=1 also the host profile of the largest B at L = 3
    echo "== DFlash speculative decoding with forced acceptance, through the Engine"
    local models="${BENCH_MODELS:-9B,35B-A3B}" budget=$(left)
    timeout $(( budget - 5 )) "$PY" benchmarks/gpu/bench_spec.py --method "${DFLASH_METHOD:-dflash}" \
        --models "$models" --deadline-s $(( budget - 20 )) ${OUT:+--out "$OUT"} ${SPEC_BATCHES:+--batches "$SPEC_BATCHES"} \
        ${SPEC_PROFILE_HOST:+--profile-host} \
        ${SPEC_DRAFT_VOCAB:+--draft-vocab "$SPEC_DRAFT_VOCAB"} ${DFLASH_BLOCKS:+--blocks "$DFLASH_BLOCKS"} \
        ${GDN_VERIFY:+--gdn-verify "$GDN_VERIFY"} || echo "bench_spec dflash rc=$?"
}

run_serve() {
    # the server needs the carried wheels (fastapi, uvicorn), the tokenizer the carried .carry/default.ninfer
    echo "== ninfer bench serve against a server process over the fast Program"
    local budget=$(( $(left) < 300 ? $(left) : 300 ))
    timeout $(( budget - 5 )) "$PY" benchmarks/gpu/bench_serve.py --models "${BENCH_MODELS:-9B,0.8B}" \
        --deadline-s $(( budget - 20 )) ${OUT:+--out "$OUT"} || echo "bench_serve rc=$?"
}

run_quant() {
    echo "== quantized weights (FP8, int4, NVFP4) beside bf16, through the Engine"
    local models="${BENCH_MODELS:-9B,35B-A3B}" budget=$(( $(left) < 300 ? $(left) : 300 ))
    timeout $(( budget - 5 )) "$PY" benchmarks/gpu/bench_quant.py --models "$models" \
        --recipes "${BENCH_RECIPES:-bf16,fp8,q4,nvfp4}" --deadline-s $(( budget - 20 )) ${OUT:+--out "$OUT"} \
        || echo "bench_quant rc=$?"
}

run_qgemv() {
    echo "== quantized decode GEMV per projection (fp8, int4 tiled and generic, nvfp4) beside bf16, with its sweep"
    timeout $(( $(left) < 230 ? $(left) - 5 : 225 )) "$PY" benchmarks/gpu/bench_qgemv.py \
        --models "${BENCH_MODELS:-9B}" ${QGEMV_VARIANTS:+--variants "$QGEMV_VARIANTS"} \
        ${QGEMV_SHAPES:+--shapes "$QGEMV_SHAPES"} ${OUT:+--out "$OUT"} || echo "bench_qgemv rc=$?"
}

run_llamacpp() {
    echo "== llama.cpp baseline (built here from the carried source)"
    timeout $(( $(left) - 5 )) "$PY" benchmarks/gpu/bench_llamacpp.py --models "${LLAMACPP_MODELS:-0.8B,9B}" \
        --deadline-s $(( $(left) - 15 )) ${OUT:+--out "$OUT"} || echo "bench_llamacpp rc=$?"
}

run_agent() {
    # the server needs the carried wheels (fastapi), the tokenizer the carried .carry/default.ninfer
    echo "== agent benchmark: multi-turn tool calls through the in-process server, fast Program, 9B"
    local budget=$(( $(left) < 240 ? $(left) : 240 ))
    timeout $(( budget - 5 )) "$PY" benchmarks/gpu/bench_agent.py --deadline-s $(( budget - 20 )) \
        ${OUT:+--out "$OUT"} || echo "bench_agent rc=$?"
}

run_pp() {
    # issue 16: both Programs of a model in one call, one stage first, then the stages (each at 90% of its devices)
    local gpus devices
    gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
    devices="${PP_DEVICES:-$([ "$gpus" -ge 2 ] && echo 0,1 || echo 0,0)}"
    echo "== pipeline stages ($devices) against one stage, through the fast Program"
    timeout $(( $(left) - 5 )) "$PY" benchmarks/gpu/bench_pp.py --models "${BENCH_MODELS:-9B,35B-A3B}" \
        --devices "$devices" --deadline-s $(( $(left) - 20 )) ${OUT:+--out "$OUT"} || echo "bench_pp rc=$?"
}

run_vision() {
    echo "== vision: the attention op, the fast tower and the fast Program's images against the reference, then the"
    echo "   tower at the 9B geometry and TTFT through the Engine"
    # VISION_BENCH_ONLY=1: the benchmark alone (the tests ran in a tests part)
    [ -n "${VISION_BENCH_ONLY:-}" ] || NINFER_TEST_DEVICE=cuda timeout "$(capped 240)" "$PY" -m pytest \
        tests/ops/test_vision_attention.py tests/ops/test_vision_rotary.py tests/ops/test_layer_norm.py \
        tests/fast_model/test_vision_tower.py tests/fast_model/test_vision_graphs.py \
        tests/fast_model/test_vision_prefill.py \
        tests/fast_program/test_vision.py tests/fast_program/test_vision_speculative.py -q -p no:cacheprovider \
        || echo "vision tests rc=$?"
    timeout $(( $(left) - 5 )) "$PY" benchmarks/gpu/bench_vision.py ${OUT:+--out "$OUT"} || echo "bench_vision rc=$?"
}

run_part() {
    case "$1" in
        tests) run_tests ;;
        engine) run_engine ;;
        hf) run_hf ;;
        micro) run_micro ;;
        profile) run_profile ;;
        moe) run_moe ;;
        spec) run_spec ;;
        dflash) run_dflash ;;
        agent) run_agent ;;
        serve) run_serve ;;
        quant) run_quant ;;
        qgemv) run_qgemv ;;
        vision) run_vision ;;
        pp) run_pp ;;
        llamacpp) run_llamacpp ;;
        *) echo "unknown part $1 (tests, engine, hf, micro, profile, moe, spec, dflash, agent, serve, quant, qgemv, vision, pp, llamacpp)"; exit 2 ;;
    esac
}

# each part its own budget (PART:SECONDS, else PART_BUDGET_S) and, with several, its own folder under OUT (their
# JSON files share names)
BASE_OUT="${OUT:-}"
[ $# -eq 0 ] && set -- tests
for arg in "$@"; do
    part="${arg%%:*}"
    START=$(date +%s)
    TOTAL_S="${PART_BUDGET_S:-560}"
    [ "$part" != "$arg" ] && TOTAL_S="${arg#*:}"
    [ -n "$BASE_OUT" ] && [ $# -gt 1 ] && OUT="$BASE_OUT/$part" && mkdir -p "$OUT"
    [ $# -gt 1 ] && echo "== part $part ($TOTAL_S s)"
    run_part "$part"
done
# the Engine beside llama.cpp and HF when this call measured them (`engine`, `llamacpp`, `hf` parts)
[ -n "$BASE_OUT" ] && [ $# -gt 1 ] && "$PY" benchmarks/gpu/report.py --peers "$BASE_OUT"
exit 0
