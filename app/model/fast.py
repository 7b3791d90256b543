"""Microsecond RTT inference: XGBoost trees walked by a compiled, branch-light kernel.

``Booster.inplace_predict`` pays tens to hundreds of microseconds of fixed cost per call (argument
checks, a proxy DMatrix, thread dispatch), while the extender scores one pod on a handful of nodes.
:class:`FastPredictor` walks the same trees (:mod:`app.model.forest`: perfect trees, ``p = 2p + 1 +
go_right``) in a numba kernel.

Each call first turns the rows into int32 keys (:func:`app.model.forest.float_keys`) laid out in
blocks of :data:`LANES` rows, feature-major inside a block, every feature twice: once with NaN as
``INT32_MIN`` (below every threshold key: goes left), once with NaN as ``INT32_MAX`` (goes right). A
node is one 64-bit word: the column of the copy its default direction needs, pre-multiplied by
:data:`LANES`, in its low half and its threshold's key in its high half, so one step is two loads (the
node, then the row's key), one integer compare and ``p = 2p + 1 + go_right`` —
exactly XGBoost's float32 ``x < threshold`` goes left, NaN its default way. Rows in full blocks go tree
by tree, sixteen rows at a time as independent chains (one tree stays in L1; the CPU overlaps the
chains' loads); a short tail goes row by row, four trees at a time. Sums are float64, added from the base
margin in tree order on both paths, so a row's prediction does not depend on where it stands in ``X``.

Each predictor remembers up to :data:`MEMO_ROWS` rows it has predicted, in an open-addressed table that
compiled code looks up before the walk and fills after it: the extender prices the same running pods on
the same nodes request after request (:mod:`app.scheduler.inflict`), kube-scheduler asks prioritize about
the pod and nodes it just filtered, a request's idle candidates of one kind share a row, and between two
scrapes a node's row changes only with what runs there and the pod's own features. A row is keyed by its
values, except the task's own features (its input size), which are keyed by their *cell*: how many of the
forest's thresholds on the feature lie at or below the value. Rows in one cell take the same path through
every tree, so a new pod whose input size falls in a cell seen before finds its candidates' rows
remembered, with the very number a walk gives. Each distinct row not remembered is walked once.

The walk kernel holds no state and releases the GIL; the memory serves one call at a time (a lock), so one
predictor may serve several threads.

>>> import numpy as np, xgboost
>>> X = np.array([[0.0], [1.0], [2.0], [3.0]] * 8, dtype=np.float32)
>>> b = xgboost.train({"max_depth": 2, "base_score": 0.0}, xgboost.DMatrix(X, label=X[:, 0] * 10), 20)
>>> fp = FastPredictor.from_booster(b)
>>> rows = np.array([[0.0], [3.0], [np.nan]], dtype=np.float32)
>>> bool(np.allclose(fp.predict(rows), b.inplace_predict(rows), rtol=1e-5))
True
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence

import numba
import numpy as np
import xgboost

from app.features.vector import TASK_FEATURES
from app.model.forest import Forest, float_keys, forest_from_booster
from app.model.train import booster_from_bytes

LANES = 16  # rows per block: independent chains per tree walk
ROWS_AS_BLOCK = 5  # a tail of at least this many rows is walked as one padded block, fewer row by row
MEMO_ROWS = 16_384  # rows a predictor remembers (its table: 1.6-6 MB at 12-46 features); then it starts afresh
TABLE_START = 256  # slots of a new predictor's table (doubled as it fills, kept at most half full)
_NAN_LEFT = np.int32(-(2**31))
_NAN_RIGHT = np.int32(2**31 - 1)


@numba.njit(inline="always")
def _float_key(b: np.int32) -> tuple[np.int32, np.bool_]:
    """The key of a float32 given by its bits (:func:`~app.model.forest.float_keys`; 0.0 and -0.0 share key 0),
    and whether it is NaN (its key is then meaningless)."""
    magnitude = b & np.int32(0x7FFFFFFF)
    k = np.int32(0) if magnitude == 0 else (b if b >= 0 else b ^ np.int32(0x7FFFFFFF))
    return k, magnitude > np.int32(0x7F800000)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _row_keys(X: np.ndarray, n_blocks: int) -> np.ndarray:  # pragma: no cover - compiled
    """``(n_blocks, 2 * width, LANES)`` int32 keys of ``X`` (see the module docstring); padding rows are 0."""
    n, width = X.shape
    bits = X.view(np.int32)
    out = np.empty((n_blocks, 2 * width, LANES), dtype=np.int32)
    for blk in range(n_blocks):
        rows = min(LANES, n - blk * LANES)
        out[blk, :, rows:] = 0
        for j in range(width):
            for lane in range(rows):
                k, nan = _float_key(bits[blk * LANES + lane, j])
                out[blk, j, lane] = _NAN_LEFT if nan else k
                out[blk, width + j, lane] = _NAN_RIGHT if nan else k
    return out


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _memo_rows(  # pragma: no cover - compiled
    X: np.ndarray, cuts: np.ndarray, starts: np.ndarray, by_cell: np.ndarray,
) -> np.ndarray:
    """``(n, width)`` int32, what the memory keys a row by: a feature with ``by_cell`` set by its cell (how many
    of its thresholds, ``cuts[starts[j]:starts[j + 1]]`` as sorted keys, are at or below the value; -1 for NaN),
    any other by its value's key (:func:`~app.model.forest.float_keys`; NaN ``INT32_MIN``)."""
    n, width = X.shape
    bits = X.view(np.int32)
    out = np.empty((n, width), dtype=np.int32)
    for j in range(width):
        cell = by_cell[j]
        first, last = starts[j], starts[j + 1]
        for i in range(n):
            b = bits[i, j]
            if cell and i and b == bits[i - 1, j]:  # the task's own features: one value down the column
                out[i, j] = out[i - 1, j]
                continue
            k, nan = _float_key(b)
            if not cell:
                out[i, j] = _NAN_LEFT if nan else k
                continue
            if nan:
                out[i, j] = -1
                continue
            lo, hi = first, last
            while lo < hi:
                mid = (lo + hi) >> 1
                if cuts[mid] <= k:
                    lo = mid + 1
                else:
                    hi = mid
            out[i, j] = lo - first
    return out


@numba.njit(inline="always")
def _step(p: np.uint64, xs: np.ndarray, at: np.uint64, nodes: np.ndarray) -> np.uint64:
    """One level down a tree whose nodes start at ``nodes[0]``: node ``p`` to a child, for the row at ``at``.

    A node is one word: the column of its copy of the feature (low half) and its threshold's key (high half),
    so a step loads it once."""
    node = nodes[p]
    key = np.int32(np.int64(node) >> np.int64(32))
    # unsigned indices: numba then emits no negative-index fix-up on the critical path
    return np.uint64(2) * p + np.uint64(1) + np.uint64(xs[at + (node & np.uint64(0xFFFFFFFF))] >= key)


@numba.njit(inline="always")
def _walk(p: np.uint64, steps: int, xs: np.ndarray, at: np.uint64, nodes: np.ndarray) -> np.uint64:
    for _ in range(steps):
        p = _step(p, xs, at, nodes)
    return p


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _blocks(  # pragma: no cover - compiled
    xs: np.ndarray, block_size: int, n_blocks: int, nodes: np.ndarray, leaves: np.ndarray, trees: np.ndarray,
    out: np.ndarray,
) -> None:
    """Rows ``0 .. LANES * n_blocks``: tree by tree, sixteen rows at a time as independent chains."""
    z = np.uint64(0)
    for t in range(trees.shape[0]):
        node0, leaf0, depth = trees[t, 0], trees[t, 1], trees[t, 2]
        inner = np.uint64((1 << depth) - 1)
        ns = nodes[node0:node0 + inner]
        lv = leaves[leaf0:leaf0 + inner + np.uint64(1)]
        for b in range(n_blocks):
            x = xs[b * block_size:(b + 1) * block_size]
            p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = z
            q0 = q1 = q2 = q3 = q4 = q5 = q6 = q7 = z
            for _ in range(depth):
                p0 = _step(p0, x, np.uint64(0), ns)
                p1 = _step(p1, x, np.uint64(1), ns)
                p2 = _step(p2, x, np.uint64(2), ns)
                p3 = _step(p3, x, np.uint64(3), ns)
                p4 = _step(p4, x, np.uint64(4), ns)
                p5 = _step(p5, x, np.uint64(5), ns)
                p6 = _step(p6, x, np.uint64(6), ns)
                p7 = _step(p7, x, np.uint64(7), ns)
                q0 = _step(q0, x, np.uint64(8), ns)
                q1 = _step(q1, x, np.uint64(9), ns)
                q2 = _step(q2, x, np.uint64(10), ns)
                q3 = _step(q3, x, np.uint64(11), ns)
                q4 = _step(q4, x, np.uint64(12), ns)
                q5 = _step(q5, x, np.uint64(13), ns)
                q6 = _step(q6, x, np.uint64(14), ns)
                q7 = _step(q7, x, np.uint64(15), ns)
            o = out[LANES * b:LANES * (b + 1)]
            o[0] += lv[p0 - inner]
            o[1] += lv[p1 - inner]
            o[2] += lv[p2 - inner]
            o[3] += lv[p3 - inner]
            o[4] += lv[p4 - inner]
            o[5] += lv[p5 - inner]
            o[6] += lv[p6 - inner]
            o[7] += lv[p7 - inner]
            o[8] += lv[q0 - inner]
            o[9] += lv[q1 - inner]
            o[10] += lv[q2 - inner]
            o[11] += lv[q3 - inner]
            o[12] += lv[q4 - inner]
            o[13] += lv[q5 - inner]
            o[14] += lv[q6 - inner]
            o[15] += lv[q7 - inner]


@numba.njit(inline="always")
def _leaf(xs: np.ndarray, at: np.uint64, tree: np.ndarray, steps: int, p: np.uint64, nodes: np.ndarray,
          leaves: np.ndarray) -> float:
    """Finish the walk of ``tree`` (a row of ``trees``) from node ``p``; its leaf value."""
    node0, depth = tree[0], tree[2]
    p = _walk(p, steps, xs, at, nodes[node0:])
    return leaves[tree[1] + p - np.uint64((1 << depth) - 1)]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _rows(  # pragma: no cover - compiled
    xs: np.ndarray, block_size: int, first: int, n: int, nodes: np.ndarray, leaves: np.ndarray, trees: np.ndarray,
    out: np.ndarray,
) -> None:
    """Rows ``first .. n`` (a short tail): row by row, four trees at a time as independent chains."""
    n_trees = trees.shape[0]
    z = np.uint64(0)
    for i in range(first, n):
        at = np.uint64((i // LANES) * block_size + i % LANES)
        acc = out[i]  # the base margin: the same additions in the same order as _blocks
        t = 0
        while t + 4 <= n_trees:
            a, b, c, d = trees[t], trees[t + 1], trees[t + 2], trees[t + 3]
            na, nb, nc, nd = nodes[a[0]:], nodes[b[0]:], nodes[c[0]:], nodes[d[0]:]
            pa = pb = pc = pd = z
            common = min(min(a[2], b[2]), min(c[2], d[2]))
            for _ in range(common):
                pa = _step(pa, xs, at, na)
                pb = _step(pb, xs, at, nb)
                pc = _step(pc, xs, at, nc)
                pd = _step(pd, xs, at, nd)
            acc += _leaf(xs, at, a, a[2] - common, pa, nodes, leaves)
            acc += _leaf(xs, at, b, b[2] - common, pb, nodes, leaves)
            acc += _leaf(xs, at, c, c[2] - common, pc, nodes, leaves)
            acc += _leaf(xs, at, d, d[2] - common, pd, nodes, leaves)
            t += 4
        while t < n_trees:
            acc += _leaf(xs, at, trees[t], trees[t, 2], z, nodes, leaves)
            t += 1
        out[i] = acc


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _predict_kernel(  # pragma: no cover - compiled; exercised through FastPredictor.predict
    X: np.ndarray, nodes: np.ndarray, leaves: np.ndarray, trees: np.ndarray, base_margin: float,
) -> np.ndarray:
    n = X.shape[0]
    full, tail = divmod(n, LANES)
    n_blocks = full + (1 if tail >= ROWS_AS_BLOCK else 0)
    rows_in_blocks = LANES * n_blocks
    xk = _row_keys(X, n_blocks + (1 if rows_in_blocks < n else 0))
    xs = xk.ravel()
    block_size = xk.shape[1] * LANES
    out = np.full(max(n, rows_in_blocks), base_margin)
    _blocks(xs, block_size, n_blocks, nodes, leaves, trees, out)
    _rows(xs, block_size, rows_in_blocks, n, nodes, leaves, trees, out)
    return out[:n]


@numba.njit(inline="always")
def _hash(row: np.ndarray) -> np.uint64:
    """A row of int32 words hashed (FNV-1a over the words, then a finaliser that spreads the low bits)."""
    h = np.uint64(0xCBF29CE484222325)
    for w in row:
        h = (h ^ np.uint64(np.uint32(w))) * np.uint64(0x100000001B3)
    h ^= h >> np.uint64(29)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    return h ^ (h >> np.uint64(32))


@numba.njit(inline="always")
def _find(keys: np.ndarray, used: np.ndarray, row: np.ndarray, h: np.uint64) -> int:
    """Where ``row`` is in the open-addressed table (``used[slot]`` set), or the free slot it would take
    (``used[slot]`` clear); the table is never full."""
    mask = np.uint64(used.size - 1)
    slot = h & mask
    width = row.size
    while used[slot]:
        same = True
        for j in range(width):
            if keys[slot, j] != row[j]:
                same = False
                break
        if same:
            return int(slot)
        slot = (slot + np.uint64(1)) & mask
    return int(slot)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _memo_find(  # pragma: no cover - compiled; exercised through FastPredictor.predict
    X: np.ndarray, cuts: np.ndarray, starts: np.ndarray, by_cell: np.ndarray, keys: np.ndarray,
    values: np.ndarray, used: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Look ``X`` up in the memory (``keys``/``values``/``used``): ``(out, rows, hashes, first, new_at)``:
    margins of the rows found (the rest unset), the rows' memo rows and hashes, per row not found the index in
    ``new_at`` of the first row with its key (-1 for rows found), and the rows to walk (each key once, in order
    of first appearance)."""
    n = X.shape[0]
    rows = _memo_rows(X, cuts, starts, by_cell)
    hashes = np.empty(n, dtype=np.uint64)
    out = np.empty(n)
    first = np.empty(n, dtype=np.int64)
    n_new = 0
    new_at = np.empty(n, dtype=np.int64)
    size = 1  # the call's own table of new keys: at least twice as many slots as rows
    while size < 2 * n:
        size *= 2
    seen_keys = np.empty((size, rows.shape[1]), dtype=np.int32)
    seen_used = np.zeros(size, dtype=np.uint8)
    seen_row = np.empty(size, dtype=np.int64)
    for i in range(n):
        h = _hash(rows[i])
        hashes[i] = h
        slot = _find(keys, used, rows[i], h)
        if used[slot]:
            out[i] = values[slot]
            first[i] = -1
            continue
        s = _find(seen_keys, seen_used, rows[i], h)
        if seen_used[s]:
            first[i] = seen_row[s]
            continue
        seen_used[s] = 1
        seen_keys[s] = rows[i]
        seen_row[s] = n_new
        first[i] = n_new
        new_at[n_new] = i
        n_new += 1
    return out, rows, hashes, first, new_at[:n_new]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _memo_fill(  # pragma: no cover - compiled; exercised through FastPredictor.predict
    out: np.ndarray, first: np.ndarray, walked: np.ndarray, rows: np.ndarray, hashes: np.ndarray,
    new_at: np.ndarray, keys: np.ndarray, values: np.ndarray, used: np.ndarray, count: np.ndarray, capacity: int,
    remember: bool,
) -> None:
    """Put the ``walked`` margins of the new rows into ``out``; with ``remember``, add them to the memory
    (``count[0]`` rows in it; it starts afresh first when they would take it past ``capacity``; at most
    ``capacity`` of them are added); ``count[1]`` counts the rows walked."""
    for i in range(out.size):
        if first[i] >= 0:
            out[i] = walked[first[i]]
    n_new = new_at.size
    count[1] += n_new
    if not remember:
        return
    if count[0] + n_new > capacity:
        used[:] = 0
        count[0] = 0
    n_new = min(n_new, capacity)
    for q in range(n_new):
        i = new_at[q]
        slot = _find(keys, used, rows[i], hashes[i])
        used[slot] = 1
        keys[slot] = rows[i]
        values[slot] = walked[q]
    count[0] += n_new


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _memo_predict(  # pragma: no cover - compiled; exercised through FastPredictor.predict
    X: np.ndarray, cuts: np.ndarray, starts: np.ndarray, by_cell: np.ndarray, keys: np.ndarray,
    values: np.ndarray, used: np.ndarray, nodes: np.ndarray, leaves: np.ndarray, trees: np.ndarray,
    base_margin: float, count: np.ndarray, capacity: int, remember: bool,
) -> np.ndarray:
    """Margins of ``X``: :func:`_memo_find`, the walk of the rows not found (:func:`_predict_kernel`) and
    :func:`_memo_fill`, in one compiled call (three calls from Python cost more than the lookups of a few dozen
    rows)."""
    out, rows, hashes, first, new_at = _memo_find(X, cuts, starts, by_cell, keys, values, used)
    if new_at.size:
        walked = _predict_kernel(X if new_at.size == X.shape[0] else X[new_at], nodes, leaves, trees, base_margin)
        _memo_fill(out, first, walked, rows, hashes, new_at, keys, values, used, count, capacity, remember)
    return out


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _rehash(  # pragma: no cover - compiled
    keys: np.ndarray, values: np.ndarray, used: np.ndarray, new_keys: np.ndarray, new_values: np.ndarray,
    new_used: np.ndarray,
) -> None:
    for slot in range(used.size):
        if used[slot]:
            s = _find(new_keys, new_used, keys[slot], _hash(keys[slot]))
            new_used[s] = 1
            new_keys[s] = keys[slot]
            new_values[s] = values[slot]


def _feature_cuts(forest: Forest) -> tuple[np.ndarray, np.ndarray]:
    """Every feature's distinct threshold keys, sorted, end to end (int32), and where each feature's start
    (int64, ``width + 1``)."""
    feature = forest.codes >> 1
    keys = float_keys(forest.thresholds)
    per = [np.unique(keys[feature == j]) for j in range(forest.num_feature)]
    starts = np.zeros(forest.num_feature + 1, dtype=np.int64)
    starts[1:] = np.cumsum([p.size for p in per])
    cuts = np.concatenate(per) if per else np.empty(0, dtype=np.int32)
    return cuts, starts


class FastPredictor:
    """A :class:`~app.model.base.Predictor` over a single-output XGBoost regression booster.

    Build it with :meth:`from_booster` or :meth:`from_bytes`; both compile (or load the cached) kernel
    and run one prediction, so the first real call is already fast.
    """

    def __init__(self, forest: Forest, by_cell: Collection[str] = TASK_FEATURES) -> None:
        self._forest = forest
        width = forest.num_feature
        feature, missing_right = forest.codes >> 1, forest.codes & 1
        columns = ((feature + width * missing_right) * LANES).astype(np.uint64)
        keys = float_keys(forest.thresholds).view(np.uint32).astype(np.uint64)
        self._nodes = columns | (keys << np.uint64(32))  # one word a node: column, then its threshold's key
        self._leaves = forest.leaves
        self._trees = forest.trees
        self._base = forest.base_margin
        self._log_link = forest.link == "log"
        self._cuts, self._starts = _feature_cuts(forest)
        self._by_cell = np.array([name in by_cell for name in forest.feature_names], dtype=np.uint8)
        # the memory of rows predicted: an open-addressed table of memo rows (memo_rows), grown as it fills
        self._keys = np.empty((TABLE_START, max(1, width)), dtype=np.int32)
        self._values = np.empty(TABLE_START)
        self._used = np.zeros(TABLE_START, dtype=np.uint8)
        self._count = np.zeros(2, dtype=np.int64)  # rows remembered, rows walked
        self._lock = threading.Lock()  # the kernel releases the GIL; one call at a time uses the table
        self.predict(np.full((1, width), np.nan, dtype=np.float32))
        self.forget()
        self._count[1] = 0
        empty = self._keys[:0]  # compiles (or loads) the growth's kernel now, not while serving
        _rehash(empty, self._values[:0], self._used[:0], empty, self._values[:0], self._used[:0])

    @classmethod
    def from_booster(cls, booster: xgboost.Booster, feature_names: Sequence[str] | None = None) -> FastPredictor:
        """From a live booster; ``feature_names`` default to the booster's own (else ``f0``, ``f1``, ...)."""
        return cls(forest_from_booster(booster, tuple(feature_names) if feature_names is not None else None))

    @classmethod
    def from_bytes(cls, raw: bytes, feature_names: Sequence[str] | None = None) -> FastPredictor:
        """From a UBJ or JSON blob as :func:`app.model.train.booster_to_bytes` writes it."""
        return cls.from_booster(booster_from_bytes(raw), feature_names)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self._forest.feature_names

    @property
    def n_trees(self) -> int:
        return int(self._trees.shape[0])

    @property
    def objective(self) -> str:
        return self._forest.objective

    def predict(self, X: np.ndarray, remember: bool = True) -> np.ndarray:
        """RTT (float64, one per row) for float32 rows in the order of :attr:`feature_names`; NaN = missing.

        Rows are looked up (by :meth:`memo_rows`) in the memory of rows predicted before, and each row not there
        is walked once; with ``remember`` False, the rows walked are not added to the memory.
        """
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self._forest.num_feature:
            raise ValueError(f"X must have shape (n, {self._forest.num_feature}) (got {X.shape})")
        n = X.shape[0]
        if not n or not X.shape[1]:
            return self._walk(X)
        with self._lock:
            if remember:
                self._room_for(n)
            out = _memo_predict(X, self._cuts, self._starts, self._by_cell, self._keys, self._values, self._used,
                                self._nodes, self._leaves, self._trees, self._base, self._count, MEMO_ROWS, remember)
        if self._log_link:
            np.exp(out, out=out)
        return out

    def _room_for(self, n: int) -> None:
        """Grow the memory's table (keeping what it holds) so that it stays at most half full after ``n`` more
        rows, up to :data:`MEMO_ROWS` rows."""
        need = 2 * min(int(self._count[0]) + n, MEMO_ROWS)
        size = self._used.size
        if need <= size:
            return
        while size < need:
            size *= 2
        keys = np.empty((size, self._keys.shape[1]), dtype=np.int32)
        values, used = np.empty(size), np.zeros(size, dtype=np.uint8)
        _rehash(self._keys, self._values, self._used, keys, values, used)
        self._keys, self._values, self._used = keys, values, used

    def memo_rows(self, X: np.ndarray) -> np.ndarray:
        """What the memory keys each row by (``(n, width)`` int32): the value's key of each feature, except the
        features in ``by_cell`` (the task's own, by default), which are keyed by their cell: how many of the
        forest's thresholds on the feature lie at or below the value (-1 for NaN). Rows keyed the same take the
        same path through every tree, so their predictions are the same number."""
        X = np.ascontiguousarray(X, dtype=np.float32)
        return _memo_rows(X, self._cuts, self._starts, self._by_cell)

    @property
    def walked(self) -> int:
        """How many rows :meth:`predict` has walked through the trees (rows not found in the memory)."""
        return int(self._count[1])

    @property
    def remembered(self) -> int:
        """How many rows the predictor remembers now."""
        return int(self._count[0])

    def forget(self) -> None:
        """Start the memory of predicted rows afresh."""
        with self._lock:
            self._used[:] = 0
            self._count[0] = 0

    def _walk(self, X: np.ndarray) -> np.ndarray:
        out = _predict_kernel(X, self._nodes, self._leaves, self._trees, self._base)
        if self._log_link:
            np.exp(out, out=out)
        return out
