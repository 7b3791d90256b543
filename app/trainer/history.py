"""Bounded per-model-key history of training samples, stored compactly, turned into (X, y) on demand.

One training-samples message becomes one row: its ``features`` map, the hardware descriptors of its
node (:func:`app.features.hardware.hardware_features`) and ``task_input_size_mb``. Rows are float32
arrays over a per-key vocabulary of feature names that grows (a row shorter than the vocabulary
is NaN — missing — in the columns added after it), so 50,000 rows of 100 features take about 25 MB
instead of the ~350 MB of as many dicts. The oldest rows fall out first (``deque(maxlen)``). A vocabulary holds
at most :data:`MAX_FEATURES_PER_KEY` names, every one a name XGBoost takes. At that cap, a sample's new names take
the columns of names no row kept carries any more (their rows have all fallen out; no row is rewritten: every row
is NaN there); a sample with a bad name, or with more new names than the rows kept leave room for, is refused whole
(:meth:`SampleHistory.add`).

>>> h = SampleHistory(max_per_key=2)
>>> for i, rtt in enumerate([100.0, 200.0, 300.0]):
...     _ = h.add({"model_key": "gCTF:gpu", "node_class": "gpu", "gpu_model": "Tesla K20c", "started_ts": i,
...            "rtt_ms": rtt, "input_size_mb": 8.0, "features": {"cpu_iowait__mean": float(i)}})
>>> ds = h.dataset("gCTF:gpu")
>>> ds.y.tolist(), ds.column("cpu_iowait__mean").tolist(), ds.column("hw_gpu_fp32_tflops").tolist()
([200.0, 300.0], [1.0, 2.0], [3.5199999809265137, 3.5199999809265137])

A sample of a task the history holds (same ``task_id`` and ``node``) is a redelivery and is not added:

>>> s = {"model_key": "k:gpu", "task_id": "t1", "node": "n1", "node_class": "gpu", "started_ts": 1.0,
...      "rtt_ms": 10.0, "features": {}}
>>> h.add(s), h.add(s), h.count("k:gpu")
(True, False, 1)

A history holds at most ``max_keys`` keys. At the bound, a sample of a new key is refused
(``model_keys_full``), unless its key is one the caller keeps (one with a model): that key takes the place of
the key no sample was added to for longest among those it does not keep (``on_evict`` hears of it):

>>> h2 = SampleHistory(max_per_key=10, max_keys=2, on_evict=lambda k: print("evicted", k))
>>> for i, key in enumerate(["a:cpu", "b:cpu"]):
...     _ = h2.add({**s, "model_key": key}, now=float(i))
>>> h2.add({**s, "model_key": "c:cpu"}, now=2.0)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
app.errors.ContractError: model_keys_full: the trainer holds the sample histories of 2 model keys, ... 'c:cpu' refused
>>> h2.add({**s, "model_key": "m:cpu"}, now=3.0, keep={"m:cpu", "b:cpu"})  # m has a model: a:cpu goes
evicted a:cpu
True
>>> h2.keys()
['b:cpu', 'm:cpu']

A key no sample was added to for a while can be dropped (:meth:`SampleHistory.drop_idle`, by the time ``now``
given with each sample); a sample of it afterwards starts its history again, from that sample:

>>> _ = h.add({**s, "task_id": "t2"}, now=100.0)  # the samples above were added at now=0
>>> h.drop_idle(now=150.0, idle_s=60.0), h.drop_idle(now=160.0, idle_s=60.0), h.count("k:gpu")
(['gCTF:gpu'], ['k:gpu'], 0)
>>> h.add(s, now=170.0), h.count("k:gpu")  # t1 again: a new history, not a redelivery of the dropped one
(True, 1)
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any

import numpy as np

from app.contracts.codec import shown_name
from app.contracts.names import bad_feature_name
from app.errors import ContractError
from app.features.hardware import HARDWARE_FEATURES, hardware_features, node_counts
from app.features.vector import TASK_FEATURES, row

# names a key's history holds at most: above the most one sample brings (1,600 by its contract, and the hardware and
# task names added here); at the cap, new names take the columns of names no row kept carries, and a sample whose new
# names would make more than it with the names the rows kept carry is refused whole
MAX_FEATURES_PER_KEY = 2_000
# names every sample brings, NaN in many (a CPU node's GPU descriptors, a task without a size): a key keeps them, never
# a column a new name takes (a row's NaN does not tell a name it carried from one it did not)
_KEPT_NAMES = frozenset((*HARDWARE_FEATURES, *TASK_FEATURES))
KEYS_FULL = "model_keys_full"  # the reason a sample of a new key is refused at the bound on keys


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Rows of one model key in time order: ``X`` (float32, NaN = missing), ``y`` (RTT ms), ``ts``."""

    X: np.ndarray
    y: np.ndarray
    ts: np.ndarray
    names: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def columns(self, names: Sequence[str]) -> np.ndarray:
        """``X`` restricted to (and ordered as) ``names``; a name this dataset lacks is an all-NaN column."""
        index = {n: j for j, n in enumerate(self.names)}
        out = np.full((len(self), len(names)), np.nan, dtype=np.float32)
        for k, name in enumerate(names):
            j = index.get(name)
            if j is not None:
                out[:, k] = self.X[:, j]
        return out

    def column(self, name: str) -> np.ndarray:
        return self.columns([name])[:, 0]

    def rows(self, start: int, stop: int | None = None) -> Dataset:
        return Dataset(self.X[start:stop], self.y[start:stop], self.ts[start:stop], self.names)

    def take(self, index: np.ndarray) -> Dataset:
        """The rows at ``index`` (integer positions), in that order."""
        return Dataset(self.X[index], self.y[index], self.ts[index], self.names)


def sample_values(sample: Mapping[str, Any]) -> dict[str, float]:
    """Every model input of one training sample: metric features, hardware descriptors, task size."""
    values: dict[str, float] = dict(sample.get("features") or {})
    # the counts from the same gauges as the extender's
    values.update(hardware_features(str(sample.get("node_class", "")), sample.get("gpu_model"), *node_counts(values)))
    size = sample.get("input_size_mb")
    values[TASK_FEATURES[0]] = float(size) if size is not None else float("nan")
    return values


class _KeyHistory:
    def __init__(self, maxlen: int) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.rows: collections.deque[tuple[float, np.ndarray, float]] = collections.deque(maxlen=maxlen)
        self.ids: collections.deque[str | None] = collections.deque(maxlen=maxlen)  # task of each row
        self.held: set[str] = set()
        self.last_added = 0.0  # the ``now`` of the newest sample added
        self.nbytes = 0  # of the rows' arrays
        # per column, the rows kept with a value there (not NaN), 1 more for a name of _KEPT_NAMES: 0 is a column no
        # row kept carries, whose name is forgotten when a new name needs its place at the cap. Counted from the rows
        # the first time a sample's new names pass the cap, kept up to date from then on (below it, no cost)
        self.uses: np.ndarray | None = None

    def count_uses(self) -> np.ndarray:
        """:attr:`uses`, counted from the rows kept (once a key, the first time its names pass the cap)."""
        uses = np.zeros(MAX_FEATURES_PER_KEY, dtype=np.int32)
        for _, values, _ in self.rows:
            uses[: values.shape[0]] += values == values  # not NaN
        for name in _KEPT_NAMES.intersection(self.index):
            uses[self.index[name]] += 1
        return uses

    def new_names(self, values: Mapping[str, float]) -> list[tuple[str, int]]:
        """The names of ``values`` this key does not hold yet, each with its column, once checked:
        :class:`ContractError` ``bad_feature_name`` for one XGBoost would refuse, ``feature_vocabulary_full`` when
        they would make more than :data:`MAX_FEATURES_PER_KEY` with the names the rows kept carry (the row the
        sample pushes out not counted). Below the cap a new name takes a new column, after the others; at it, the
        column of a name no row kept carries (the first such columns)."""
        index = self.index
        if values.keys() <= index.keys():  # the usual case, in C
            return []
        new = [n for n in values if n not in index]
        bad = bad_feature_name(new)
        if bad is not None:
            raise ContractError("bad_feature_name", f"feature name {shown_name(bad)} is no name a model can be trained"
                                " on (XGBoost refuses '[', ']' and '<'; the contract takes letters, digits, '_',"
                                " '.', ':', '-')")
        width = len(self.names)
        if width + len(new) <= MAX_FEATURES_PER_KEY:  # below the cap, as ever: no column looked at
            return [(n, width + k) for k, n in enumerate(new)]
        if self.uses is None:
            self.uses = self.count_uses()
        uses = self.uses[:width].copy()
        if len(self.rows) == self.rows.maxlen:  # the oldest row falls out as this one comes in
            leaving = self.rows[0][1]
            uses[: leaving.shape[0]] -= leaving == leaving
        uses[[index[n] for n in values if n in index]] += 1  # and this one carries the names it has of the key's
        free = np.flatnonzero(uses == 0)
        carried = width - free.shape[0]
        if carried + len(new) > MAX_FEATURES_PER_KEY:
            raise ContractError("feature_vocabulary_full", f"{len(new):,} new feature names (the first"
                                f" {shown_name(new[0])}) would make {carried + len(new):,} for this key,"
                                f" more than the {MAX_FEATURES_PER_KEY:,} a key holds; the key keeps its"
                                f" {carried:,}")
        columns = free[: len(new)].tolist()
        columns += range(width, width + len(new) - len(columns))
        return list(zip(new, columns, strict=True))

    def add(self, ts: float, values: Mapping[str, float], rtt_ms: float, task: str | None = None) -> bool:
        """Add one row; False for a task held already. A row with names :meth:`new_names` refuses is refused whole
        (its error raised, nothing kept)."""
        if task is not None and task in self.held:
            return False
        new = self.new_names(values)
        if len(self.ids) == self.ids.maxlen:
            self.held.discard(self.ids[0])  # type: ignore[arg-type]  # the row about to fall out
            leaving = self.rows[0][1]
            self.nbytes -= leaving.nbytes
            if self.uses is not None:
                self.uses[: leaving.shape[0]] -= leaving == leaving
        self.ids.append(task)
        if task is not None:
            self.held.add(task)
        for name, j in new:
            if j < len(self.names):  # a forgotten name's column: NaN in every row kept, so missing for this name
                del self.index[self.names[j]]
                self.names[j] = name
            else:
                self.names.append(name)
            self.index[name] = j
            if self.uses is not None:
                self.uses[j] = name in _KEPT_NAMES
        values_row = row(values, self.names)
        if self.uses is not None:
            self.uses[: values_row.shape[0]] += values_row == values_row
        self.nbytes += values_row.nbytes
        self.rows.append((ts, values_row, rtt_ms))
        return True


class SampleHistory:
    """The most recent ``max_per_key`` training samples of every model key.

    Parameters
    ----------
    max_per_key
        Bound of each key's history, ``>= 1`` (the oldest sample is dropped first).
    max_keys
        Keys held at most, ``>= 1``; None: no bound (see :meth:`add`).
    on_evict
        Called with each key whose history :meth:`add` dropped to make room for a key it keeps.
    """

    def __init__(self, max_per_key: int = 50_000, max_keys: int | None = None,
                 on_evict: Callable[[str], None] | None = None) -> None:
        if max_per_key < 1:
            raise ValueError(f"max_per_key must be >= 1 (got {max_per_key})")
        if max_keys is not None and max_keys < 1:
            raise ValueError(f"max_keys must be >= 1 (got {max_keys})")
        self.max_per_key = int(max_per_key)
        self.max_keys = max_keys
        self.on_evict = on_evict
        self._keys: dict[str, _KeyHistory] = {}

    def add(self, sample: Mapping[str, Any], now: float = 0.0, keep: Container[str] = ()) -> bool:
        """Add one decoded training-samples value (its ``model_key`` says where) at time ``now`` (for
        :meth:`drop_idle`); False for a sample of a task (``task_id`` and ``node``) the key's history already
        holds — the worker sends samples at least once, so a crash may repeat some.

        A sample the key's history cannot take is refused whole, with a :class:`~app.errors.ContractError` (the
        trainer dead-letters and counts it, and logs it once) and nothing of it kept: a feature name XGBoost would
        refuse (``bad_feature_name``: one such name would fail every retrain of the key; the contract refuses it
        first, this is for a sample an older contract let through), or new names that would make more than
        :data:`MAX_FEATURES_PER_KEY` for the key with the names its rows carry (``feature_vocabulary_full``: the
        names the key's rows use are kept, not crowded out; names no row kept carries any more make room).

        A sample of a new key while the history holds ``max_keys`` keys is refused the same way
        (``model_keys_full``: a producer inventing keys would hold a history and a metric series for each), unless
        its key is in ``keep`` (the trainer's: keys with a model, keys training): then the key no sample was added
        to for longest, of those not in ``keep``, is dropped in its place (``on_evict``); with none such, refused."""
        key = str(sample["model_key"])
        hist = self._keys.get(key)
        fresh = hist is None
        full = fresh and self.max_keys is not None and len(self._keys) >= self.max_keys
        if full and key not in keep:  # refused before anything of it is built
            raise self._full(key, keep)
        if hist is None:
            hist = _KeyHistory(self.max_per_key)
        task = sample.get("task_id")
        ident = f"{task}|{sample.get('node')}" if task is not None else None
        added = hist.add(float(sample["started_ts"]), sample_values(sample), float(sample["rtt_ms"]), ident)
        # a refused sample (raised above) leaves the key as it was, a new key absent; an older ``now`` (a sample read
        # late, of a replay) does not make the key look idle longer than its newest sample says
        hist.last_added = now if fresh else max(hist.last_added, now)
        if full:
            self._evict_for(key, keep)
        if fresh:
            self._keys[key] = hist
        return added

    def _evict_for(self, key: str, keep: Container[str]) -> None:
        """Drop the history of the key idle longest not in ``keep`` to make room for ``key``; none such:
        :class:`ContractError` ``model_keys_full``."""
        idle = min(((h.last_added, k) for k, h in self._keys.items() if k not in keep), default=None)
        if idle is None:
            raise self._full(key, keep)
        del self._keys[idle[1]]
        if self.on_evict is not None:
            self.on_evict(idle[1])

    def _full(self, key: str, keep: Container[str]) -> ContractError:
        return ContractError(KEYS_FULL, f"the trainer holds the sample histories of {len(self._keys):,} model keys,"
                             f" its bound (RTT_TRAINER_MAX_KEYS), none of which it may drop for this new"
                             f" key{'' if key in keep else ' without a model'}: {shown_name(key)} refused")

    def drop_idle(self, now: float, idle_s: float, keep: Container[str] = (),
                  until: Callable[[str], float] | None = None) -> list[str]:
        """Drop the history of every key (but those in ``keep``) no sample was added to in the last ``idle_s``
        before ``now`` (``until``: before ``until(key)`` instead, for a key whose samples are known only up to
        then); the keys dropped, sorted."""
        gone = sorted(k for k, h in self._keys.items()
                      if (now if until is None else until(k)) - h.last_added >= idle_s and k not in keep)
        for k in gone:
            del self._keys[k]
        return gone

    @property
    def nbytes(self) -> int:
        """Bytes of the rows' feature arrays, all keys (the bulk of the history; a row's tuple, its array's header,
        its task id and its deque and set slots add about 360 bytes a row: 330–400 measured with UUID task ids,
        as the set's table grows in steps)."""
        return sum(h.nbytes for h in self._keys.values())

    def __len__(self) -> int:
        return sum(len(h.rows) for h in self._keys.values())

    @property
    def n_keys(self) -> int:
        """Keys whose history is held."""
        return len(self._keys)

    def full_for(self, key: str) -> bool:
        """Whether a sample of ``key`` would be a new key at the bound (``max_keys`` held, ``key`` not one)."""
        return self.max_keys is not None and len(self._keys) >= self.max_keys and key not in self._keys

    def count(self, key: str) -> int:
        hist = self._keys.get(key)
        return len(hist.rows) if hist else 0

    def keys(self) -> list[str]:
        return sorted(self._keys)

    def snapshot(self, key: str) -> tuple[tuple[str, ...], list[tuple[float, np.ndarray, float]]]:
        """A cheap copy of one key's rows (for building the dataset off the event loop)."""
        hist = self._keys.get(key)
        if hist is None:
            return (), []
        return tuple(hist.names), list(hist.rows)

    def dataset(self, key: str) -> Dataset:
        return build_dataset(*self.snapshot(key))


def build_dataset(names: tuple[str, ...], rows: Sequence[tuple[float, np.ndarray, float]]) -> Dataset:
    """Stack a snapshot into a :class:`Dataset`, rows sorted by task start time (stable)."""
    X = np.full((len(rows), len(names)), np.nan, dtype=np.float32)
    ts = np.empty(len(rows), dtype=np.float64)
    y = np.empty(len(rows), dtype=np.float64)
    for i, (t, values, rtt) in enumerate(rows):
        X[i, : values.shape[0]] = values
        ts[i] = t
        y[i] = rtt
    order = np.argsort(ts, kind="stable")
    return Dataset(X[order], y[order], ts[order], names)
