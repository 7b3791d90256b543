"""Metric names read from code and from PromQL, for the deployment tests (their conftest.py gives them as
fixtures). Kept out of conftest.py so that their doctests run: the conftest files are not collected as
doctest modules (pyproject's ``--ignore-glob``), since two of them in folders without ``__init__.py``
would be one module ``conftest`` to ``--doctest-modules``.
"""

from __future__ import annotations

import ast
import re

_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                 "offset", "inf", "nan"}
_METRIC_CLASSES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum", "CounterMetricFamily"}
_SUFFIXES = {
    "Counter": ("_total", "_created"),
    "CounterMetricFamily": ("_total",),  # a custom collector's counter (no _created unless given one)
    "Gauge": ("",),
    "Histogram": ("_bucket", "_sum", "_count", "_created"),
    "Summary": ("", "_sum", "_count", "_created"),
    "Info": ("_info",),
    "Enum": ("",),
}


def _string_constants(tree: ast.Module) -> dict[str, str]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
    return out


def metric_series(tree: ast.Module) -> set[str]:
    """Series names exposed by the prometheus_client metrics a module defines with literal names.

    >>> src = 'N = "rtt_x_seconds"; Histogram(N, "d"); Counter("rtt_y_total", "d", ["kind"])'
    >>> src += '; CounterMetricFamily("rtt_z", "d")'
    >>> sorted(n for n in metric_series(ast.parse(src)) if not n.endswith("_created"))
    ['rtt_x_seconds_bucket', 'rtt_x_seconds_count', 'rtt_x_seconds_sum', 'rtt_y_total', 'rtt_z_total']
    """
    consts = _string_constants(tree)
    series: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        cls = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if cls not in _METRIC_CLASSES:
            continue
        kwargs = {k.arg: k.value for k in node.keywords if k.arg}
        name_node = node.args[0] if node.args else kwargs.get("name")

        def literal(n: ast.expr | None) -> str | None:
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                return n.value
            if isinstance(n, ast.Name):
                return consts.get(n.id)
            return None

        name = literal(name_node)
        if not name:
            continue
        full = "_".join(p for p in (literal(kwargs.get("namespace")), literal(kwargs.get("subsystem")), name) if p)
        if cls in ("Counter", "CounterMetricFamily"):
            full = full.removesuffix("_total")
        series |= {full + suffix for suffix in _SUFFIXES[cls]}
    return series


def promql_metrics(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (not functions, aggregations, labels or keywords).

    >>> sorted(promql_metrics('histogram_quantile(0.9, sum by (le, verb) (rate(a_bucket{verb="x"}[1m]))) / b'))
    ['a_bucket', 'b']
    """
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", s):
        if s[m.end():].lstrip().startswith("(") or m.group(0).lower() in _PROMQL_WORDS:
            continue
        names.add(m.group(0))
    return names
