"""Per-task records of one run, indexed by submission order; they grow for closed-loop workloads.

>>> log = TaskLog(2)
>>> log.submitted(0, "gCTF", 80.0, 0.5); log.submitted(3, "upload", 10.0, 1.0)
>>> len(log), log.arrays()["submit_s"].tolist()[:2], log.arrays()["node_idx"].tolist()
(4, [0.5, nan], [-1, -1, -1, -1])
"""

from __future__ import annotations

import numpy as np

FLOATS = ("input_mb", "submit_s", "start_s", "finish_s", "expected_ms", "work_ms", "served_ms")


class TaskLog:
    """Columns of per-task figures (NaN until known; ``node_idx`` -1 until placed)."""

    def __init__(self, capacity: int) -> None:
        self._n = 0
        self.apps: list[str] = []
        self.cols = {k: np.full(max(capacity, 1), np.nan) for k in FLOATS}
        self.node_idx = np.full(max(capacity, 1), -1, dtype=np.int32)

    def __len__(self) -> int:
        return self._n

    def _ensure(self, i: int) -> None:
        size = len(self.node_idx)
        if i >= size:
            new = max(2 * size, i + 1)
            for k, col in self.cols.items():
                self.cols[k] = np.concatenate([col, np.full(new - size, np.nan)])
            self.node_idx = np.concatenate([self.node_idx, np.full(new - size, -1, dtype=np.int32)])
        if i >= self._n:
            self.apps.extend([""] * (i + 1 - self._n))
            self._n = i + 1

    def submitted(self, i: int, app: str, input_mb: float, submit_s: float) -> None:
        self._ensure(i)
        self.apps[i] = app
        self.cols["input_mb"][i] = input_mb
        self.cols["submit_s"][i] = submit_s

    def started(self, i: int, node_idx: int, start_s: float, expected_ms: float, work_ms: float) -> None:
        self.node_idx[i] = node_idx
        self.cols["start_s"][i] = start_s
        self.cols["expected_ms"][i] = expected_ms
        self.cols["work_ms"][i] = work_ms

    def finished(self, i: int, finish_s: float, served_ms: float) -> None:
        self.cols["finish_s"][i] = finish_s
        self.cols["served_ms"][i] = served_ms

    def arrays(self) -> dict[str, np.ndarray]:
        """Trimmed copies of every column (plus ``node_idx``)."""
        out = {k: v[: self._n].copy() for k, v in self.cols.items()}
        out["node_idx"] = self.node_idx[: self._n].copy()
        return out
