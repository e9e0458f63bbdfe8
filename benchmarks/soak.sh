#!/usr/bin/env bash
# The property harness's soak profile over many seeds at once: JOBS processes per test file, each with its own
# --hypothesis-seed, every Engine boundary counted. On a machine with many cores (the GPU host's 16 CPU cores, say)
# it reaches 100k+ boundaries per Program in minutes. Prints one line per file: seeds, seeds that finished with no
# failure (a seed stopped at SOAK_TIMEOUT_S counts its boundaries and, when nothing failed, as "stopped"), boundaries.
#
#   JOBS=6 NINFER_SOAK_EXAMPLES=6000 bash benchmarks/soak.sh [FILE ...]
#   env: JOBS (default 4), NINFER_SOAK_EXAMPLES (the soak profile's budget; Program files take 1/20 of it per
#        machine), SOAK_TIMEOUT_S (per process, default 1800), OUT (logs go there when set)
set -u
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
JOBS="${JOBS:-4}"
LOGS="${OUT:-/tmp}/soak"
mkdir -p "$LOGS"
FILES=("$@")
[ ${#FILES[@]} -eq 0 ] && FILES=(tests/properties/test_engine_properties.py tests/reference_program/test_properties.py
                                tests/fast_program/test_properties.py)
export HYPOTHESIS_PROFILE=soak PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
for f in "${FILES[@]}"; do
    rm -f "$LOGS/$(echo "${f%.py}" | tr / _)"-*.log
    for i in $(seq 1 "$JOBS"); do
        # SIGINT at the time limit: pytest stops between examples and still prints the boundary count
        timeout -s INT -k 60 "${SOAK_TIMEOUT_S:-1800}" "$PY" -m pytest -q -p no:cacheprovider "$f" --hypothesis-seed="$i" \
            > "$LOGS/$(echo "${f%.py}" | tr / _)-$i.log" 2>&1 &
    done
done
wait
for f in "${FILES[@]}"; do
    name=$(echo "${f%.py}" | tr / _)  # two files may share a base name
    passed=0 stopped=0 steps=0
    for log in "$LOGS/$name"-*.log; do
        last=$(grep -E "[0-9]+ (passed|failed)" "$log" | tail -1)
        if [[ "$last" == *passed* && "$last" != *failed* && "$last" != *error* ]]; then passed=$((passed + 1))
        elif grep -q KeyboardInterrupt "$log" && ! grep -qE "^(FAILED|ERROR) |Falsifying" "$log"; then
            stopped=$((stopped + 1)); fi
        n=$(grep -oE "property harness: [0-9,]+" "$log" | grep -oE "[0-9,]+$" | tr -d ,)
        steps=$((steps + ${n:-0}))
    done
    echo "soak $f: $JOBS seeds, $passed passed, $stopped stopped at the limit with no failure, $steps Engine boundaries"
done
