"""Collectives and their volume per decoder layer, counted from the real model on the meta device
(BOOST Fig. 7, the volume half; :mod:`boost_titan.planner.collectives`). No GPU needed.

    python -m scripts.bench.comm_volume            # 7B, b=4, s=4096, tp 2/4/8 → docs/results/comm_volume_7b_counted.*
"""

from __future__ import annotations

import argparse
import shlex
import sys

from boost_titan.models import FLAVORS
from boost_titan.planner.collectives import layer_collectives, summarize
from scripts.bench.results import env_info, print_table, write_results


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavor", default="7B")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--tp", default="2,4,8")
    p.add_argument("--out", default="docs/results/comm_volume_7b_counted")
    a = p.parse_args(argv)
    base = FLAVORS[a.flavor]
    rows = []
    for tp in map(int, a.tp.split(",")):
        for strategy, flavor_args, norm in [("fullrank", FLAVORS[f"{a.flavor}_fullrank"], "online"),
                                            ("vanilla", base, "online"), ("btp", base, "sync"),
                                            ("btp", base, "online")]:
            s = summarize(layer_collectives(strategy, flavor_args, tp, a.batch, a.seq, rmsnorm=norm))
            name = strategy if strategy != "btp" else f"btp ({norm} norm)"
            rows.append({"tp": tp, "strategy": name, "fwd_count": s["forward"]["count"],
                         "fwd_MiB": round(s["forward"]["payload_MiB"], 3), "bwd_count": s["backward"]["count"],
                         "bwd_MiB": round(s["backward"]["payload_MiB"], 3),
                         "fwd_ops": s["forward"]["ops"], "bwd_ops": s["backward"]["ops"]})
    meta = {**env_info("cpu"), "flavor": a.flavor, "batch": a.batch, "seq": a.seq, "dtype": "bf16",
            "command": shlex.join(["python", "-m", "scripts.bench.comm_volume",
                                   *(sys.argv[1:] if argv is None else argv)])}
    columns = ["tp", "strategy", "fwd_count", "fwd_MiB", "bwd_count", "bwd_MiB"]
    write_results(a.out, rows, meta, f"Communication volume per decoder layer ({a.flavor}, b={a.batch}, "
                  f"s={a.seq}, bf16)", columns=columns,
                  notes="Counted from the model on a fake process group (no GPU). Payload = all-reduce "
                        "input; all-gather/reduce-scatter count half their full tensor. The JSON lists "
                        "every collective (`fwd_ops`, `bwd_ops`).")
    print_table(rows, columns)


if __name__ == "__main__":
    main()
