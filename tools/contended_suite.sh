#!/usr/bin/env bash
# The whole test suite RUNS times in a row beside BURNERS busy-looping processes: the suite must stay
# green on a machine someone else is using. Stops at the first failing run. Logs and a summary go to
# runs/<date>-contended-suite/. Usage: make test-contended [RUNS=5] [BURNERS=2]
set -uo pipefail
RUNS=${RUNS:-5}
BURNERS=${BURNERS:-2}
out=runs/$(date +%Y-%m-%d)-contended-suite-$(date +%H%M)
mkdir -p "$out"
burners=()
stop_burners() { [ ${#burners[@]} -eq 0 ] || kill "${burners[@]}" 2>/dev/null; }
trap stop_burners EXIT
trap 'exit 130' INT TERM
for _ in $(seq "$BURNERS"); do python3 -c "while True: pass" & burners+=($!); done
echo "$(nproc) CPUs ($(lscpu | sed -n 's/^Model name: *//p')), $BURNERS burners, $RUNS runs: $out" | tee "$out/summary.txt"
for k in $(seq "$RUNS"); do
    start=$(date +%s)
    if make test > "$out/run-$k.log" 2>&1; then verdict=passed; else verdict=FAILED; fi
    line="run $k/$RUNS $verdict in $(( $(date +%s) - start )) s: $(grep -E '(passed|failed|error)' "$out/run-$k.log" | tail -1)"
    echo "$line" | tee -a "$out/summary.txt"
    [ "$verdict" = passed ] || exit 1
done
