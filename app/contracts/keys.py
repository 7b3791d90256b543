"""Message keys that are not plain node names.

A model key names one model: per app × node class (hardware descriptors are features, so an unseen node
still gets a prediction), or per app × node once that node has enough samples of its own. An app is a
Kubernetes label value (the topic contracts' ``app`` pattern), so its keys are names the model registry
stores (:func:`app.registry.base.check_model_key`).

>>> model_key("gCTF", "gpu")
'gCTF:gpu'
>>> model_key("gCTF", "gpu", "worker-3")
'gCTF:gpu:worker-3'
>>> parse_model_key("gCTF:gpu:worker-3")
('gCTF', 'gpu', 'worker-3')
"""

from __future__ import annotations

import re

from app.errors import ContractError

APP_PATTERN = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")  # a label value: the contracts' ``app``


def model_key(app: str, node_class: str, node: str | None = None) -> str:
    return f"{app}:{node_class}:{node}" if node else f"{app}:{node_class}"


def parse_model_key(key: str) -> tuple[str, str, str | None]:
    parts = key.split(":", 2)
    if len(parts) < 2 or parts[1] not in ("cpu", "gpu") or not parts[0]:
        raise ContractError("bad_model_key", f"{key!r} is not app:node_class[:node]")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else None
