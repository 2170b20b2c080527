"""Every committed PREDICTED result file, regenerated from the current code by one command.

    python -m scripts.bench.predicted            # rewrite docs/results/*_predicted*.{json,md}
    python -m scripts.bench.predicted --check    # exit 1 naming each file the current code disagrees with

A prediction is never edited by hand: a change to the planner, the model or a measured constant is
followed by this command, and ``tests/test_predicted_files.py`` fails while a committed file differs
from what the code prints (rows and sections; the date and git lines are left out of the comparison).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import tempfile
from pathlib import Path

from scripts.bench.e2e import ROOT

RESULTS = ROOT / "docs" / "results"
PREDICTED = {  # file stem in docs/results -> (module with main(argv), its arguments)
    "planner_7b_8xh200_predicted": ("scripts.bench.plan", ["--flavor", "7B", "--gpus", "8", "--top", "8"]),
    "planner_13b_8xh200_predicted": ("scripts.bench.plan", ["--flavor", "13B", "--gpus", "8", "--top", "6"]),
    "planner_13b_8xh200_mb4_predicted": ("scripts.bench.plan", ["--flavor", "13B", "--gpus", "8", "--batch", "16",
                                                                "--microbatch", "4", "--top", "8"]),
    "multinode_predicted_h200": ("scripts.bench.multinode_predictions", []),
    "btp_map_predicted": ("scripts.bench.btp_map", []),
    "1b_elementwise_floor_predicted": ("scripts.bench.elementwise_floor", ["--flavors", "1B,1B_fullrank"]),
}


def write(stem: str, out_dir: Path) -> Path:
    """Run the file's command with ``--out out_dir/stem``; returns the JSON path."""
    module, args = PREDICTED[stem]
    importlib.import_module(module).main([*args, "--out", str(out_dir / stem)])
    return out_dir / f"{stem}.json"


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-9)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def differences(stem: str, fresh: Path) -> list[str]:
    """Where the committed file's rows and sections differ from ``fresh`` (the same command, now)."""
    committed = RESULTS / f"{stem}.json"
    if not committed.is_file():
        return [f"{committed} is missing"]
    old, new = json.loads(committed.read_text()), json.loads(fresh.read_text())
    out = []
    for key in ("rows", "sections"):
        if not _same(old.get(key), new.get(key)):
            rows_old, rows_new = old.get(key) or [], new.get(key) or []
            first = next((i for i, (x, y) in enumerate(zip(rows_old, rows_new)) if not _same(x, y)), None)
            out.append(f"{committed.name}: {key} differ" + (f" (first at {first})" if first is not None else
                                                            f" ({len(rows_old)} vs {len(rows_new)})"))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="compare with the committed files instead of writing them")
    a = p.parse_args(argv)
    if not a.check:
        for stem in PREDICTED:
            write(stem, RESULTS)
        return
    with tempfile.TemporaryDirectory() as tmp:
        stale = [d for stem in PREDICTED for d in differences(stem, write(stem, Path(tmp)))]
    print("\n".join(stale) or "every predicted file is current")
    sys.exit(1 if stale else 0)


if __name__ == "__main__":
    main()
