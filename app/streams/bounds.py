"""How much one worker holds: caps on nodes and apps, and who has gone silent.

A worker keeps per-node state (a window, a tracker, metric series) and per-app state (detectors, error
series). Both are bounded:

* **caps** — at most ``RTT_WORKER_MAX_NODES`` nodes and ``RTT_WORKER_MAX_APPS`` apps at a time; a message
  for a new node or app beyond the cap is refused with a :class:`~app.errors.ContractError`
  (``node_cap`` / ``app_cap``), which the intake sends to dead-letters — nothing grows without bound
  whatever names producers invent;
* **silence** — a node with no message of any kind for ``RTT_NODE_EVICT_AFTER_S`` (its last *arrival*
  on this worker's clock, not its own ``ts``) is evicted (:mod:`app.streams.eviction`), and so is an app
  no message named for as long, which frees their places under the caps. Only what a message named since
  the process started is here: state read back from a checkpoint and named by none is found, and evicted
  after the same silence, by :mod:`app.streams.eviction` itself. An app admitted that is not held
  (new, or evicted before) is handed to the ``on_new_app`` callbacks (the feedback loop loads a returning
  app's models again).

>>> b = Bounds(max_nodes=2, max_apps=1)
>>> b.admit_node("a", 0.0); b.admit_node("b", 0.0); b.admit_node("a", 5.0)
>>> b.admit_node("c", 6.0)
Traceback (most recent call last):
...
app.errors.ContractError: node_cap: node 'c' would be number 3; this worker holds at most 2 (RTT_WORKER_MAX_NODES)
>>> b.silent_nodes(now=10.0, after_s=6.0)
['b']
"""

from __future__ import annotations

from collections.abc import Callable

from app.errors import ContractError


class Bounds:
    """Nodes and apps this worker holds, with the time (monotonic) each was last heard of."""

    def __init__(self, max_nodes: int, max_apps: int) -> None:
        if max_nodes < 1 or max_apps < 1:
            raise ValueError(f"max_nodes and max_apps must be >= 1 (got {max_nodes}, {max_apps})")
        self.max_nodes = max_nodes
        self.max_apps = max_apps
        self.nodes: dict[str, float] = {}
        self.partitions: dict[str, int] = {}  # node -> the partition of the last message that named it
        self.apps: dict[str, float] = {}
        self.on_new_app: list[Callable[[str], None]] = []

    def admit_node(self, node: str, now: float, partition: int | None = None) -> None:
        """Note ``node`` as heard of at ``now`` (in ``partition``, when known); ``node_cap`` if it is new and the
        worker is full."""
        if node not in self.nodes and len(self.nodes) >= self.max_nodes:
            raise ContractError("node_cap", f"node {node!r} would be number {len(self.nodes) + 1}; this worker"
                                f" holds at most {self.max_nodes} (RTT_WORKER_MAX_NODES)")
        self.nodes[node] = now
        if partition is not None:
            self.partitions[node] = partition

    def admit_app(self, app: str, now: float) -> None:
        """Note ``app`` as heard of at ``now``; ``app_cap`` if it is not held and the worker is full."""
        if app in self.apps:
            self.apps[app] = now
            return
        if len(self.apps) >= self.max_apps:
            raise ContractError("app_cap", f"app {app!r} would be number {len(self.apps) + 1}; this worker"
                                f" tracks at most {self.max_apps} (RTT_WORKER_MAX_APPS)")
        self.apps[app] = now
        for callback in self.on_new_app:
            callback(app)

    def silent_nodes(self, now: float, after_s: float) -> list[str]:
        return [n for n, t in self.nodes.items() if now - t >= after_s]

    def silent_apps(self, now: float, after_s: float) -> list[str]:
        return [a for a, t in self.apps.items() if now - t >= after_s]

    def forget_nodes(self, nodes: set[str] | list[str]) -> None:
        for n in nodes:
            self.nodes.pop(n, None)
            self.partitions.pop(n, None)

    def forget_apps(self, apps: set[str] | list[str]) -> None:
        for a in apps:
            self.apps.pop(a, None)
