"""The mapping file (``mapping.yaml``): exporters, and how their metrics become canonical node metrics.

Loaded once and validated at start; every problem is a :class:`MappingError` naming its path in the file.

>>> m = load_mapping()
>>> m.metric("cpu_iowait").sources[0].kind
'share'
>>> [s.metric for s in m.metric("nvidia_smi_utilization_gpu").sources]
['DCGM_FI_DEV_GPU_UTIL', 'nvidia_smi_utilization_gpu_ratio']
>>> m.metric("nvidia_smi_memory_used").sources[0].scale   # MiB -> bytes
1048576.0
>>> m.metric("gpu_memory_total_bytes").sources[1].plus   # DCGM: used + free, per GPU
('DCGM_FI_DEV_FB_FREE',)
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from app.bridge.errors import MappingError
from app.bridge.mapping_build import build
from app.bridge.mapping_types import MetricMap
from app.errors import read_error

DEFAULT_PATH = Path(__file__).with_name("mapping.yaml")


@functools.lru_cache(maxsize=8)
def load_mapping(path: Path | str | None = None) -> MetricMap:
    """Read and validate a mapping file (default: the one shipped beside this module)."""
    p = Path(path) if path else DEFAULT_PATH
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise MappingError(str(p), f"cannot read mapping: {read_error(exc)}") from None
    return build(doc, p.name)
