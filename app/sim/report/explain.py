"""Placements explained, in the report: a few ``/explain`` answers as tables (one per pod).

An answer is the JSON of :func:`app.scheduler.explain.explain` (the extender's ``POST /explain`` and
``rttsched explain --json`` give the same): per candidate node its score and how it came about.

>>> node = {"node": "worker-3", "hardware": "RTX 4090", "score": 10, "model_rtt_ms": 48.2, "correction": 1.0,
...         "penalty": 1.0, "rtt_ms": 48.2, "credibility": 0.74, "learnt": True, "explored": False, "failed": None,
...         "contributions": [{"feature": "load__mean", "value": 0.5, "contribution": -0.41}]}
>>> "worker-3 · RTX 4090" in explain_section([{"pod": {"app": "gCTF", "name": "p"}, "best": "worker-3",
...                                            "nodes": [node]}])
True
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

COLUMNS = ("node", "score", "model ms", "correction", "assumed pods ×", "scored ms", "credibility", "learnt",
           "explored", "filtered out", "what moved the prediction (margin scale)")


def _num(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _moved(n: Mapping[str, Any]) -> str:
    contribs = n.get("contributions")
    if not contribs:
        return str(n.get("contributions_error") or "-")
    return ", ".join(f"{c['feature']} = {_num(c.get('value'), 3)}: {c['contribution']:+.3f}" for c in contribs)


def _row(n: Mapping[str, Any], hardware: Mapping[str, str]) -> str:
    hw = hardware.get(n["node"]) or n.get("hardware")  # the report's words (CPU 32 cores) over the view's (cpu)
    label = f"{n['node']} · {hw}" if hw else n["node"]
    cells = (label, _num(n.get("score")), _num(n.get("model_rtt_ms")), _num(n.get("correction"), 3),
             _num(n.get("penalty"), 2), _num(n.get("rtt_ms")), _num(n.get("credibility"), 2),
             "yes" if n.get("learnt") else "no", "yes" if n.get("explored") else "", n.get("failed") or "",
             _moved(n))
    text = {0, 9, 10}
    return "<tr>" + "".join(f'<td class="{"text" if i in text else "num"}">{html.escape(str(c))}</td>'
                            for i, c in enumerate(cells)) + "</tr>"


def explain_section(answers: Sequence[Mapping[str, Any]], hardware: Mapping[str, str] | None = None) -> str:
    """One table per answer, with the pod and the chosen node above it; ``hardware``: node -> its hardware."""
    out = ['<p class="note">Asked of the extender at the end of the live run, one pod per app: per candidate, the '
           "model's prediction, the residual correction, the factor for pods assumed but not yet in the metrics, "
           "the RTT the score comes from, credibility, exploration, the filters, and the three features whose "
           "XGBoost pred_contribs moved the prediction most (margin scale: with reg:gamma's log link a "
           "contribution c multiplies the RTT by e^c). Best first.</p>"]
    for a in answers:
        pod = a.get("pod", {})
        head = f"{pod.get('app')} pod {pod.get('name') or ''}".strip()
        head += f" — neutral answer: {a['neutral']}" if a.get("neutral") else f" — placed on {a.get('best')}"
        if a.get("explored"):
            head += " (exploring)"
        out.append(f"<h3>{html.escape(head)}</h3>")
        out.append('<table class="explain"><tr>' + "".join(f"<th>{html.escape(t)}</th>" for t in COLUMNS) + "</tr>"
                   + "".join(_row(n, hardware or {}) for n in a.get("nodes", [])) + "</table>")
    return "\n".join(out)
