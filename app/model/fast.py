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

Each predictor remembers up to :data:`MEMO_ROWS` rows it has predicted, compared bit for bit: the
extender prices the same running pods on the same nodes request after request
(:mod:`app.scheduler.inflict`), and a request's idle candidates of one kind share a row; those rows are
walked once. The memory is an open-addressing table of the rows' bits, looked up, filled and walked in one
compiled call (:func:`_remembered`): a Python dictionary keyed by each row's bytes cost about as much as
the walk of a request's new rows.

The compiled call releases the GIL (a simulation's retrains in other threads go on meanwhile); the memory
is the predictor's, so calls on one predictor take its lock (threads sharing one take turns).

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
from collections.abc import Sequence

import numba
import numpy as np
import xgboost

from app.model.forest import Forest, float_keys, forest_from_booster
from app.model.train import booster_from_bytes

LANES = 16  # rows per block: independent chains per tree walk
ROWS_AS_BLOCK = 5  # a tail of at least this many rows is walked as one padded block, fewer row by row
MEMO_ROWS = 16_384  # rows a predictor remembers; then it starts afresh
MEMO_SLOTS = 2 * MEMO_ROWS  # table slots (a power of two): at most half full; 6 MB at 46 features
_NAN_LEFT = np.int32(-(2**31))
_NAN_RIGHT = np.int32(2**31 - 1)


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
                b = bits[blk * LANES + lane, j]
                magnitude = b & np.int32(0x7FFFFFFF)  # 0.0 and -0.0 share key 0; NaN: above +inf
                k = np.int32(0) if magnitude == 0 else (b if b >= 0 else b ^ np.int32(0x7FFFFFFF))
                nan = magnitude > np.int32(0x7F800000)
                out[blk, j, lane] = _NAN_LEFT if nan else k
                out[blk, width + j, lane] = _NAN_RIGHT if nan else k
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
def _row_hash(bits: np.ndarray, i: int) -> np.uint64:
    """A 64-bit hash of row ``i``'s words: each word and its column mixed by one multiplication, independent
    of the others (no chain from word to word), xored, then murmur3's finaliser."""
    h = np.uint64(0)
    for j in range(bits.shape[1]):
        h ^= (np.uint64(np.uint32(bits[i, j])) + np.uint64(j) * np.uint64(0x9E3779B97F4A7C15)) \
            * np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> np.uint64(33))


@numba.njit(inline="always")
def _same_row(a: np.ndarray, i: int | np.int64, b: np.ndarray, k: int | np.int64) -> bool:
    for j in range(a.shape[1]):
        if a[i, j] != b[k, j]:
            return False
    return True


@numba.njit(inline="always")
def _probe(table: np.ndarray, used: np.ndarray, bits: np.ndarray, i: int, h: np.uint64) -> np.int64:
    """The slot holding row ``i`` of ``bits``, or the free slot where it would go."""
    mask = table.shape[0] - 1
    s = np.int64(h & np.uint64(mask))
    while used[s] and not _same_row(table, s, bits, i):
        s = (s + 1) & mask
    return s


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _remembered(  # pragma: no cover - compiled; exercised through FastPredictor.predict
    X: np.ndarray, table: np.ndarray, values: np.ndarray, used: np.ndarray, count: np.ndarray, limit: int,
    nodes: np.ndarray, leaves: np.ndarray, trees: np.ndarray, base_margin: float, log_link: bool,
) -> np.ndarray:
    """Predictions of the rows of ``X``: remembered ones from the table (``table`` rows' bits, ``values``,
    ``used`` slots, ``count[0]`` rows in it), the others walked once each and remembered. The table starts
    afresh when the new rows would take it past ``limit``; beyond ``limit`` new rows of one call are not kept."""
    n = X.shape[0]
    bits = X.view(np.int32)
    hashes = np.empty(n, dtype=np.uint64)
    out = np.empty(n)
    first = np.empty(n, dtype=np.int64)  # a new row's first index in X; -1: remembered
    todo = np.empty(n, dtype=np.int64)
    n_todo = 0
    size = 16
    while size < 2 * n:
        size *= 2
    local = np.zeros(size, dtype=np.int64)  # new rows of this call (todo index + 1) by hash: repeats walked once
    local_mask = local.shape[0] - 1
    for i in range(n):
        h = _row_hash(bits, i)
        hashes[i] = h
        s = _probe(table, used, bits, i, h)
        if used[s]:
            out[i] = values[s]
            first[i] = -1
            continue
        q = np.int64(h & np.uint64(local_mask))
        while local[q] and not _same_row(bits, todo[local[q] - 1], bits, i):
            q = (q + 1) & local_mask
        if not local[q]:
            todo[n_todo] = i
            n_todo += 1
            local[q] = n_todo
        first[i] = todo[local[q] - 1]
    if n_todo == 0:
        return out
    walked = _predict_kernel(X if n_todo == n else X[todo[:n_todo]], nodes, leaves, trees, base_margin)
    if log_link:
        walked = np.exp(walked)
    for k in range(n_todo):
        out[todo[k]] = walked[k]
    for i in range(n):
        if first[i] >= 0:
            out[i] = out[first[i]]
    if count[0] + n_todo > limit:
        used[:] = False
        count[0] = 0
    for k in range(min(n_todo, limit - count[0])):
        i = todo[k]
        s = _probe(table, used, bits, i, hashes[i])
        table[s] = bits[i]
        values[s] = out[i]
        used[s] = True
        count[0] += 1
    return out


class FastPredictor:
    """A :class:`~app.model.base.Predictor` over a single-output XGBoost regression booster.

    Build it with :meth:`from_booster` or :meth:`from_bytes`; both compile (or load the cached) kernel
    and run one prediction, so the first real call is already fast.
    """

    def __init__(self, forest: Forest) -> None:
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
        # the memory of predicted rows (module docstring): their bits, predictions, occupied slots, row count
        self._table = np.empty((MEMO_SLOTS, width), dtype=np.int32)  # pages touched as rows arrive
        self._values = np.empty(MEMO_SLOTS)
        self._used = np.zeros(MEMO_SLOTS, dtype=np.bool_)
        self._count = np.zeros(1, dtype=np.int64)
        self._lock = threading.Lock()
        self.predict(np.full((1, width), np.nan, dtype=np.float32))
        self.forget()

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

    def predict(self, X: np.ndarray) -> np.ndarray:
        """RTT (float64, one per row) for float32 rows in the order of :attr:`feature_names`; NaN = missing."""
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self._forest.num_feature:
            raise ValueError(f"X must have shape (n, {self._forest.num_feature}) (got {X.shape})")
        if not X.shape[0] or not X.shape[1]:
            return self._walk(X)
        with self._lock:
            return _remembered(X, self._table, self._values, self._used, self._count, min(MEMO_ROWS, MEMO_SLOTS // 2),
                               self._nodes, self._leaves, self._trees, self._base, self._log_link)

    @property
    def remembered(self) -> int:
        """How many rows the predictor remembers now."""
        return int(self._count[0])

    def forget(self) -> None:
        """Start the memory of predicted rows afresh."""
        with self._lock:
            self._used[:] = False
            self._count[0] = 0

    def _walk(self, X: np.ndarray) -> np.ndarray:
        out = _predict_kernel(X, self._nodes, self._leaves, self._trees, self._base)
        if self._log_link:
            np.exp(out, out=out)
        return out
