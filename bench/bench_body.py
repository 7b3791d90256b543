"""A large request body's buffer: allocating it and receiving into it, zero-filled against uninitialised.

    python3 bench/bench_body.py                  # 14 MB bodies (a NodeList of 5,000 nodes), 20 alive at once
    python3 bench/bench_body.py --mb 1 --alive 4

The extender receives a body above ``LARGE_BODY`` straight into a buffer of its ``Content-Length``
(``app/extender/http.py``), and kube-scheduler sends 5,000-node NodeLists of 14 MB, up to 20 at once in the
extender's bench. Two buffers, each filled in 256 KB pieces as the socket would, with ``--alive`` bodies
held at once and then released (as their requests are answered):

* ``bytearray``: ``bytearray(n)``, which zero-fills every page before the socket writes it;
* ``extender``: ``numpy.empty(n, uint8).data``, left uninitialised (every byte is received before it is read).

Best of the trials, ms per body; the ratio is against ``bytearray``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

PIECE = 256 * 1024


def per_body_ms(make: Callable[[int], memoryview], n: int, alive: int, trials: int) -> float:
    piece = b"x" * PIECE
    best = float("inf")
    for _ in range(trials):
        held: list[Any] = []
        t0 = time.perf_counter()
        for _ in range(alive):
            body = make(n)
            for off in range(0, n, PIECE):
                end = min(n, off + PIECE)
                body[off:end] = piece[:end - off]
            held.append(body)
        del held
        best = min(best, (time.perf_counter() - t0) / alive)
    return best * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=14.0)
    ap.add_argument("--alive", type=int, default=20)
    ap.add_argument("--trials", type=int, default=5)
    a = ap.parse_args()
    n = int(a.mb * 1024 * 1024)
    ways: dict[str, Callable[[int], memoryview]] = {
        "bytearray": lambda size: memoryview(bytearray(size)),
        "extender": lambda size: np.empty(size, dtype=np.uint8).data,
    }
    rows = {}
    for name, make in ways.items():
        print(f"[bench] {name}: {a.alive} bodies of {a.mb:g} MB, {a.trials} trials", flush=True)
        rows[name] = per_body_ms(make, n, a.alive, a.trials)
    print(f"\n| buffer | ms per {a.mb:g} MB body (allocate + receive), {a.alive} alive | × bytearray |")
    print("|---|---|---|")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.2f} | {rows['bytearray'] / ms:.2f} |")


if __name__ == "__main__":
    main()
