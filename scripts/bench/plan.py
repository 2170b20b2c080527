"""The layout planner's table as a result file (PREDICTED): ``python -m boost_titan.planner``'s options, plus ``--out``.

    python -m scripts.bench.plan --flavor 7B --gpus 8 --out docs/results/planner_7b_8xh200_predicted
"""

from __future__ import annotations

import shlex
import sys

from boost_titan.planner.__main__ import COLUMNS, parser, run
from scripts.bench.results import env_info, write_results


def main(argv=None) -> None:
    p = parser()
    p.prog = "python -m scripts.bench.plan"
    p.add_argument("--out", required=True, help="write <out>.json and <out>.md (every layout)")
    a = p.parse_args(argv)
    rows, title = run(p, a)
    meta = {**env_info("cpu"), "command": shlex.join(["python", "-m", "scripts.bench.plan",
                                                      *(sys.argv[1:] if argv is None else argv)])}
    write_results(a.out, rows, meta, f"PREDICTED layouts: {title}", columns=COLUMNS + ["fits"],
                  notes="Every number is a prediction; how it is made: `python -m boost_titan.planner --help`.")


if __name__ == "__main__":
    main()
