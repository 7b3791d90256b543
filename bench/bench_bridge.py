"""Cost of turning one node's scrape into a node-metrics message, on the real node_exporter capture + DCGM.

    python3 bench/bench_bridge.py [--quick]

Rows: parsing every line with prometheus_client (the baseline), parsing only the lines the mapping reads,
and the whole assembly of one node message (filtered parse, mapping, rates, health checks). The last
column is how many nodes one core could serve at a 1 s scrape interval.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.bridge.exposition import parse_exposition  # noqa: E402
from app.bridge.mapping import load_mapping  # noqa: E402
from app.bridge.snapshot import NodeAssembler, TargetResult  # noqa: E402
from app.bridge.targets import Endpoint, Target  # noqa: E402

SHARED = REPO / "tests" / "fixtures" / "exporters"
LOCAL = REPO / "tests" / "fixtures" / "exporters"


def per_call_s(fn: Callable[[], object], n: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a few seconds)")
    args = ap.parse_args()
    n = 20 if args.quick else 200
    node = [(SHARED / f"node_exporter-1.5.0.scrape-{x}.prom").read_text() for x in "ab"]
    dcgm = [(LOCAL / f"dcgm-exporter-3.3.5.rtx4090.scrape-{x}.prom").read_text() for x in "ab"]
    mapping = load_mapping()
    urls = ("http://n:9100/metrics", "http://n:9400/metrics")
    asm = NodeAssembler(Target("n", tuple(Endpoint(u) for u in urls)), mapping)
    tick = [0.0]

    def assemble() -> None:
        i = int(tick[0]) % 2
        tick[0] += 1.0
        asm.assemble([TargetResult(urls[0], tick[0], node[i]), TargetResult(urls[1], tick[0], dcgm[i])], tick[0])

    rows = [
        ("parse all lines (baseline)", per_call_s(lambda: (parse_exposition(node[0]), parse_exposition(dcgm[0])), n)),
        ("parse mapped lines only", per_call_s(lambda: (parse_exposition(node[0], mapping.wanted),
                                                        parse_exposition(dcgm[0], mapping.wanted)), n)),
        ("assemble one node message", per_call_s(assemble, n)),
    ]
    lines = sum(len(t.splitlines()) for t in (node[0], dcgm[0]))
    print(f"one node scrape = node_exporter 1.5.0 + dcgm-exporter (2 GPUs): {lines} lines; {n} x 3 runs, best")
    print(f"{'case':<30} {'ms/scrape':>10} {'vs baseline':>12} {'nodes/core @1Hz':>16}")
    base = rows[0][1]
    for name, s in rows:
        print(f"{name:<30} {s * 1e3:>10.3f} {base / s:>11.1f}x {1 / s:>16.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
