#!/usr/bin/env bash
# `make test` beside CPU burners: the suite must pass on a busy machine (issue: "a suite that a busy machine
# passes"). Starts BURNERS (default 2) `python -c "while True: pass"` processes, runs `make test` RUNS times
# (default 1) in this checkout, stops the burners on any exit, and prints one line per run: pass/fail, minutes.
#   bash scripts/busy_test.sh            # one run beside two burners
#   RUNS=3 BURNERS=2 bash scripts/busy_test.sh
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-1}
BURNERS=${BURNERS:-2}
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap stop EXIT INT TERM
for _ in $(seq "$BURNERS"); do
  python3 -c "while True: pass" &
  pids+=($!)
done
status=0
for i in $(seq "$RUNS"); do
  start=$(date +%s)
  if make test >"busy-test-$i.log" 2>&1; then result=pass; else result=fail; status=1; fi
  end=$(date +%s)
  echo "run $i beside $BURNERS burner(s): $result, $(( (end - start) / 60 )) min $(( (end - start) % 60 )) s (busy-test-$i.log)"
done
exit $status
