"""Feature selection when a metric is absent on a node class: each class votes on the metrics it has.

A model key (app x ``gpu``/``cpu``) pools nodes of several hardware classes -- K20c, M40, RTX 4090 nodes --
whose exporters do not report the same metrics (docs/bridge.md lists them: PCIe throughput and engine
activity on datacenter GPUs only, compute processes only from nvidia_gpu_exporter 1.9.0 on, ...). In the
rows of a class without a metric, its column is NaN. The measures drop NaN pairwise, so such a column is
voted on with the rows of the classes that have it -- and a class of a handful of rows can carry it alone
(on four points MIC reads 1). So when the classes do not all have the same metrics:

* rows are grouped by hardware class (:func:`class_labels`: the GPU descriptors of the row, equal for the
  nodes of one GPU model);
* each class with at least ``min_rows`` rows runs the selection on its own rows, over the columns it has
  (two distinct finite values or more there): a column that is all NaN in a class never takes part in that
  class's vote, and a class too small to vote chooses nothing;
* the model's metric features are the union of the classes' choices, in candidate order; the choice of each
  class is kept (:attr:`ClassSelection.per_class`).

When every class has every candidate column, the selection runs once over all rows, as it always did.

>>> import numpy as np
>>> rng = np.random.default_rng(3)
>>> util, pcie = rng.uniform(size=200), rng.uniform(size=200)
>>> labels = ["k20c"] * 100 + ["a100"] * 100
>>> pcie[:100] = np.nan                                   # no PCIe throughput on the K20c nodes
>>> y = np.where(np.arange(200) < 100, 10 * util, 10 * pcie) + rng.normal(scale=0.3, size=200)
>>> pick = lambda X, y, names: [n for j, n in enumerate(names) if abs(np.corrcoef(X[:, j], y)[0, 1]) > 0.5]
>>> res = select_by_class(pick, np.column_stack([util, pcie]), y, ["util", "pcie"], labels)
>>> res.chosen, res.per_class
(('util', 'pcie'), {'a100': ('pcie',), 'k20c': ('util',)})
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from app.features.hardware import HARDWARE_FEATURES

# the GPU model's descriptors (not the node's counts of cores and GPUs)
CLASS_FEATURES = tuple(n for n in HARDWARE_FEATURES if n not in ("hw_cpu_cores", "hw_gpu_count"))
MIN_CLASS_ROWS = 30  # rows a class needs to vote on its own
POOLED = "*"  # the per_class key of a selection run over all rows

Selector = Callable[[np.ndarray, np.ndarray, Sequence[str]], Sequence[str]]


@dataclasses.dataclass(frozen=True)
class ClassSelection:
    """The chosen feature names, and each voting class's own choice (``{POOLED: ...}`` when pooled)."""

    chosen: tuple[str, ...]
    per_class: dict[str, tuple[str, ...]]


def class_labels(hardware: np.ndarray) -> list[str]:
    """One label per row of hardware descriptor columns (NaN -- unknown or no GPU -- is a value too).

    >>> class_labels(np.array([[5.0, 208.0], [24.0, 1008.0], [np.nan, np.nan], [5.0, 208.0]]))
    ['5/208', '24/1008', 'nan/nan', '5/208']
    """
    h = np.asarray(hardware, dtype=np.float64)
    return ["/".join(f"{v:g}" for v in row) for row in h.reshape(len(h), -1)]


def _has(col: np.ndarray) -> bool:
    return bool(np.isfinite(col).any())


def _varies(col: np.ndarray) -> bool:
    finite = col[np.isfinite(col)]
    return finite.size >= 2 and finite.min() != finite.max()


def select_by_class(selector: Selector, X: np.ndarray, y: np.ndarray, names: Sequence[str],
                    labels: Sequence[str], min_rows: int = MIN_CLASS_ROWS) -> ClassSelection:
    """Select per hardware class when the classes do not have the same columns (see the module doc)."""
    xm, yv = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    lab = np.asarray(labels, dtype=object)
    if xm.shape != (len(yv), len(names)) or len(lab) != len(yv):
        raise ValueError(f"X must be rows x names and labels one per row (got {xm.shape}, {len(names)} names, "
                         f"{len(lab)} labels, {len(yv)} targets)")
    classes = sorted(set(lab.tolist()))
    rows = {c: np.flatnonzero(lab == c) for c in classes}
    same = all(_has(xm[rows[c], j]) for c in classes for j in range(len(names)))
    voting = [c for c in classes if len(rows[c]) >= min_rows]
    if same or not voting:
        chosen = tuple(selector(xm, yv, list(names)))
        return ClassSelection(tuple(n for n in names if n in set(chosen)), {POOLED: chosen})
    per_class: dict[str, tuple[str, ...]] = {}
    for c in voting:
        r = rows[c]
        cols = [j for j in range(len(names)) if _varies(xm[r, j])]
        if not cols:
            per_class[c] = ()
            continue
        picked = set(selector(xm[r][:, cols], yv[r], [names[j] for j in cols]))
        per_class[c] = tuple(names[j] for j in cols if names[j] in picked)
    union = {n for chosen in per_class.values() for n in chosen}
    return ClassSelection(tuple(n for n in names if n in union), per_class)
