#!/usr/bin/env bash
# The whole suite on a GPU machine: the tests marked gpu use the GPU, every other test and the
# processes it starts see none (tests/conftest.py). Writes the result (date, card, torch, the pytest
# summary line, each failed test, each skip and its reason) to docs/results/test_gpu.md.
#   scripts/test_gpu.sh [pytest args]       e.g. scripts/test_gpu.sh -m "not e2e"
#   TIMEOUT=500 scripts/test_gpu.sh         interrupt pytest after 500 s: it still reports what ran
#   JOBS=8                                  pytest-xdist workers, where it is installed (default 8)
set -uo pipefail
cd "$(dirname "$0")/.."
# every test process spawns up to 4 ranks: one or two threads each keeps a 16-core box from thrashing
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
log=$(mktemp)
parallel=()  # pytest-xdist where it is installed (the test extra), else one process
python -c "import xdist" 2>/dev/null && parallel=(-n "${JOBS:-8}" --dist loadfile)
runner=()
[ "${TIMEOUT:-0}" != 0 ] && runner=(timeout -s INT "$TIMEOUT")
# the machine's CPU time (user, nice, system, idle, iowait, ...) from /proc/stat, in jiffies
cpu_times() { head -1 /proc/stat | cut -d' ' -f3-; }
cpu_before=$(cpu_times)
# -v: one line per test as it ends, so an interrupted run still says which ran and which failed
"${runner[@]}" python -m pytest -v -rfEs "${parallel[@]}" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# how busy the cores were while it ran: near 100% means the suite waits on the CPUs, not on the tests
busy=$(python - "$cpu_before" "$(cpu_times)" <<'PY'
import sys
before, after = ([int(v) for v in s.split()] for s in sys.argv[1:])
delta = [a - b for a, b in zip(after, before)]
idle = delta[3] + delta[4]  # idle and iowait
print(f"{100 * (1 - idle / max(1, sum(delta[:8]))):.0f}% of {__import__('os').cpu_count()} cores")
PY
)
card=$(python -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')")
torch_version=$(python -c "import torch; print(torch.__version__)")
# the optional packages whose tests skip without them (torchao and transformers are in the test extra)
missing=$(python -c "import importlib.util as u; print(', '.join(m for m in ('torchao', 'transformers', 'flash_attn', 'xdist') if u.find_spec(m) is None) or 'none')")
summary=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)" "$log" | tail -1 | tr -d '=' | xargs)
interrupted=$(grep -q "KeyboardInterrupt" "$log" && echo " (interrupted after ${TIMEOUT:-?} s: the tests that ran)")
{
  echo "# The suite on a GPU machine"
  echo
  echo "- **date**: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- **card**: $card"
  echo "- **torch**: $torch_version"
  echo "- **git**: $(git describe --always --dirty 2>/dev/null || echo unknown)"
  echo "- **optional packages missing**: $missing"
  echo "- **CPU busy while it ran**: $busy"
  echo "- **command**: \`TIMEOUT=${TIMEOUT:-0} JOBS=${JOBS:-8} scripts/test_gpu.sh${*:+ ${*@Q}}\`"
  echo "- **result**: ${summary:-no summary line} (exit status $status)$interrupted"
  # the -v lines ("[gw3] [ 75%] FAILED tests/...", or "tests/... FAILED"), not the -rfE summary ("FAILED tests/...")
  verdicts=$(grep "::" "$log" | grep -vE "^(FAILED|ERROR) ")
  echo "- **per-test lines**: $(echo "$verdicts" | grep -oE "\b(PASSED|FAILED|SKIPPED|ERROR)\b" | sort | uniq -c | xargs)"
  failed=$(echo "$verdicts" | grep -E "\b(FAILED|ERROR)\b" | grep -oE "tests/[^ ]+::[^ ]+" | sort -u)
  [ -n "$failed" ] && { echo; echo "Failed:"; echo; echo "$failed" | sed 's/^/- /'; }
  # the -rs summary ("SKIPPED [2] tests/x.py:12: reason"): on a GPU machine a gpu test should not be here
  skipped=$(grep -E "^SKIPPED \[[0-9]+\]" "$log" | sed -E 's/^SKIPPED //' | sort)
  [ -n "$skipped" ] && { echo; echo "Skipped ([count] where: reason):"; echo; echo "$skipped" | sed 's/^/- /'; }
} > docs/results/test_gpu.md
rm -f "$log"
exit "$status"
