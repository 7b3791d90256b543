"""Placements explained, in the report: a few ``/explain`` answers as tables (one per pod).

An answer is the JSON of :func:`app.scheduler.explain.explain` (``rttsched explain --json`` and the
extender's ``POST /explain`` give the same): per candidate node its score and how it came about.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

COLUMNS = (("node", "node"), ("score", "score"), ("model_rtt_ms", "model ms"), ("correction", "correction"),
           ("penalty", "assumed pods ×"), ("rtt_ms", "scored ms"), ("credibility", "credibility"),
           ("explored", "explored"), ("failed", "filtered out"), ("top", "what moved the prediction"))


def _num(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _top(node: Mapping[str, Any], k: int = 3) -> str:
    parts = [f"{c['feature']} {c['contribution']:+.3f}" for c in node.get("contributions", [])[:k]]
    return ", ".join(parts) or "-"


def _row(n: Mapping[str, Any]) -> str:
    cells = {
        "node": n.get("label") or n["node"], "score": _num(n.get("score")),
        "model_rtt_ms": _num(n.get("model_rtt_ms")), "correction": _num(n.get("correction"), 3),
        "penalty": _num(n.get("penalty"), 2), "rtt_ms": _num(n.get("rtt_ms")),
        "credibility": _num(n.get("credibility"), 2), "explored": "yes" if n.get("explored") else "",
        "failed": n.get("failed") or "", "top": _top(n),
    }
    return "<tr>" + "".join(f'<td class="{"text" if key in ("node", "failed", "top") else "num"}">'
                            f"{html.escape(str(cells[key]))}</td>" for key, _ in COLUMNS) + "</tr>"


def explain_section(answers: Sequence[Mapping[str, Any]]) -> str:
    """One table per answer, with the pod, the link scale and the chosen node above it."""
    out = ['<p class="note">Asked of the extender during the live run (or of the same scoring code offline): '
           "per candidate, the model's prediction, the residual correction, the penalty for pods assumed but not yet "
           "in the metrics, the score, and the three features whose SHAP contributions (XGBoost pred_contribs, on "
           "the model's margin scale) moved the prediction most.</p>"]
    for a in answers:
        pod = a.get("pod", {})
        head = f"{pod.get('app')} pod {pod.get('name') or pod.get('task_id') or ''}".strip()
        if a.get("neutral"):
            head += f" — neutral answer: {a['neutral']}"
        elif a.get("best"):
            head += f" — best: {a['best']}"
        out.append(f"<h3>{html.escape(head)}</h3>")
        out.append("<table class='explain'><tr>" + "".join(f"<th>{html.escape(t)}</th>" for _, t in COLUMNS) + "</tr>"
                   + "".join(_row(n) for n in a.get("nodes", [])) + "</table>")
    return "\n".join(out)
