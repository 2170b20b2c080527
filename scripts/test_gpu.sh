#!/usr/bin/env bash
# The whole suite on a GPU machine: the GPU-only tests run there, the CPU distributed tests pin their
# ranks to the CPU (tests/conftest.py run_distributed). Writes the result (date, card, torch, the
# pytest summary line) to docs/results/test_gpu.md.
#   scripts/test_gpu.sh [pytest args]       e.g. scripts/test_gpu.sh -m "not e2e"
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
parallel=()  # pytest-xdist where it is installed (the test extra), else one process
python -c "import xdist" 2>/dev/null && parallel=(-n "${JOBS:-8}" --dist loadfile)
python -m pytest -q "${parallel[@]}" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
card=$(python -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')")
torch_version=$(python -c "import torch; print(torch.__version__)")
summary=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed)" "$log" | tail -1 | tr -d '=' | xargs)
cat > docs/results/test_gpu.md <<MD
# The suite on a GPU machine

- **date**: $(date -u +%Y-%m-%dT%H:%M:%SZ)
- **card**: $card
- **torch**: $torch_version
- **git**: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)
- **command**: \`scripts/test_gpu.sh $*\`
- **result**: $summary (exit status $status)
MD
rm -f "$log"
exit "$status"
