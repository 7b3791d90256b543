"""A large request body's buffer: allocating it and receiving into it, zero-filled against uninitialised.

    python3 bench/bench_body.py                  # 14 MB bodies (a NodeList of 5,000 nodes), 20 alive at once
    python3 bench/bench_body.py --mb 1 --alive 4
    python3 bench/bench_body.py --quick          # 4 MB bodies, 8 alive, 3 trials: about a second

The extender receives a body above ``LARGE_BODY`` straight into a buffer of its ``Content-Length``
(``app/extender/http.py``), and kube-scheduler sends 5,000-node NodeLists of 14 MB, up to 20 at once in the
extender's bench. Two buffers, each filled in 256 KB pieces as the socket would, with ``--alive`` bodies
held at once and then released (as their requests are answered):

* ``bytearray``: ``bytearray(n)``, which zero-fills every page before the socket writes it;
* ``uninitialised``: ``numpy.empty(n, uint8).data``, left uninitialised (every byte is received before it is read);
* ``extender``: the server's :class:`~app.extender.http_types.BodyBuffers`: uninitialised arrays given back
  once answered and taken again by the next bodies.

The first trial writes memory new to the process (on a virtual machine, possibly new to the machine too);
ms per body in it and the best of the trials; the ratio is against ``bytearray``'s best.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from arguments import positive_float, positive_int

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.extender.http_types import BodyBuffers  # noqa: E402

PIECE = 256 * 1024


def per_body_ms(make: Callable[[int], Any], view: Callable[[Any], memoryview], release: Callable[[Any], None],
                n: int, alive: int, trials: int) -> tuple[float, float]:
    """(first trial, best trial) in ms per body."""
    piece = b"x" * PIECE
    times = []
    for _ in range(trials):
        held: list[Any] = []
        t0 = time.perf_counter()
        for _ in range(alive):
            buf = make(n)
            body = view(buf)
            for off in range(0, n, PIECE):
                end = min(n, off + PIECE)
                body[off:end] = piece[:end - off]
            del body
            held.append(buf)
        while held:
            release(held.pop())
        times.append((time.perf_counter() - t0) / alive * 1000)
    return times[0], min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=positive_float, default=None, help="body size in MB (default 14; --quick: 4)")
    ap.add_argument("--alive", type=positive_int, default=None, help="bodies held at once (default 20; --quick: 8)")
    ap.add_argument("--trials", type=positive_int, default=None, help="trials (default 5; --quick: 3)")
    ap.add_argument("--quick", action="store_true", help="smaller bodies, fewer alive, fewer trials")
    a = ap.parse_args()
    a.mb = a.mb if a.mb is not None else (4.0 if a.quick else 14.0)
    a.alive = a.alive if a.alive is not None else (8 if a.quick else 20)
    a.trials = a.trials if a.trials is not None else (3 if a.quick else 5)
    n = int(a.mb * 1024 * 1024)
    pool = BodyBuffers()
    ways: dict[str, tuple[Callable[[int], Any], Callable[[Any], memoryview], Callable[[Any], None]]] = {
        "bytearray": (bytearray, memoryview, lambda buf: None),
        "uninitialised": (lambda size: np.empty(size, dtype=np.uint8), lambda buf: buf.data, lambda buf: None),
        "extender": (pool.take, lambda buf: buf.data[:n], pool.give),
    }
    rows = {}
    for name, (make, view, release) in ways.items():
        print(f"[bench] {name}: {a.alive} bodies of {a.mb:g} MB, {a.trials} trials", flush=True)
        rows[name] = per_body_ms(make, view, release, n, a.alive, a.trials)
    base = rows["bytearray"][1]
    print(f"\n| buffer | ms per {a.mb:g} MB body (allocate + receive), {a.alive} alive: first trial | best | "
          "× bytearray (best) |")
    print("|---|---|---|---|")
    for name, (first, best) in rows.items():
        print(f"| {name} | {first:.2f} | {best:.2f} | {base / best:.2f} |")


if __name__ == "__main__":
    main()
