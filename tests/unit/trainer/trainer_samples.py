"""What the trainer's unit tests share: gCTF samples with a learnable RTT, a Kafka consumer at its end."""

from __future__ import annotations

from typing import Any

import numpy as np

KEY = "gCTF:gpu"


def samples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """gCTF samples whose RTT follows GPU utilisation (plus 2 % noise)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        util = float(rng.uniform(0, 100))
        out.append({"model_key": KEY, "task_id": f"task-{i}", "app": "gCTF", "node": f"gpu-{i % 3}",
                    "node_class": "gpu", "gpu_model": "Tesla M40", "started_ts": 1_700_000_000.0 + i,
                    "rtt_ms": (300.0 + 6.0 * util) * float(rng.normal(1.0, 0.02)), "input_size_mb": 64.0,
                    "window_s": 30.0, "features": {"nvidia_smi_utilization_gpu__mean": util,
                                                   "cpu_iowait__mean": float(rng.uniform(0, 5))}})
    return out


class AtTheEnd:
    """A Kafka consumer with nothing left to read: the trainer's catch-up returns at once."""

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {}
