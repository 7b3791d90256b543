"""Prometheus text exposition -> samples, through ``prometheus_client``'s own parser.

Samples keep the name they carry in the text. (``prometheus_client`` renames the samples of a counter whose
``# TYPE`` line lacks ``_total`` -- ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER`` becomes ``..._total`` -- so the
declared name is restored here.) Values are kept raw: NaN, infinities and DCGM's blank sentinels are
dropped later, by the mapping, which knows which exporter wrote them.

Before parsing, lines of metrics nobody asked for can be dropped (``keep``): a node_exporter page has
~1,000 lines of which the mapping reads ~130, and parsing is the bridge's main cost (~5x less work).

A scraped page that is not whole is no reading (:class:`ExpositionError`, a failed scrape), as Prometheus
rejects it: one whose last line has no line feed (cut short: the format ends every line with one, and the
lines dropped before parsing would hide a cut inside a metric nobody reads), a series given twice (its
samples would be added up), more than :data:`MAX_SERIES` series of the metrics read (a runaway label:
parsing 250,000 of them took 400 MB, above the bridge's memory limit).

>>> text = '''# TYPE node_load1 gauge
... node_load1 0.27
... # TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter
... DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0"} 1024
... go_goroutines 7
... '''
>>> e = parse_exposition(text, keep={"node_load1", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"})
>>> sorted(e.samples)
['DCGM_FI_DEV_PCIE_REPLAY_COUNTER', 'node_load1']
>>> e.get("DCGM_FI_DEV_PCIE_REPLAY_COUNTER")[0].labels["gpu"]
'0'
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from app.bridge.errors import ExpositionError

MAX_SERIES = 50_000  # sample lines of the metrics read, per page (a node_exporter page: ~130; a big host: thousands)
_COUNTER_TYPE = re.compile(r"^#\s+TYPE\s+(\S+)\s+counter\s*$", re.MULTILINE)
_NAME_END = re.compile(r"[{\s]")


class Sample(NamedTuple):
    name: str
    labels: Mapping[str, str]
    value: float


class Exposition:
    """The samples of one scrape, by sample name."""

    __slots__ = ("samples",)

    def __init__(self, samples: dict[str, list[Sample]]) -> None:
        self.samples = samples

    def get(self, name: str) -> list[Sample]:
        return self.samples.get(name, [])

    def __contains__(self, name: object) -> bool:
        return name in self.samples

    def __len__(self) -> int:
        return sum(len(v) for v in self.samples.values())


def _expand(keep: Collection[str]) -> frozenset[str]:
    """Names whose ``# TYPE`` lines matter: a counter may be declared with or without ``_total``."""
    out = set(keep)
    out.update(n[:-6] for n in keep if n.endswith("_total"))
    out.update(n + "_total" for n in keep)
    return frozenset(out)


def filter_lines(text: str, keep: Collection[str]) -> str:
    """Only the sample lines (and their ``# TYPE`` lines) of the metrics in ``keep``; no ``# HELP``.

    >>> filter_lines("# HELP a x\\n# TYPE a gauge\\na 1\\nb{x=\\"1\\"} 2\\n# free comment\\n", {"a"})
    '# TYPE a gauge\\na 1'
    """
    meta = _expand(keep)
    kept: list[str] = []
    for line in text.split("\n"):
        s = line.strip()
        if not s:
            continue
        if s[0] == "#":
            parts = s.split(None, 3)
            if len(parts) >= 3 and parts[1] == "TYPE" and parts[2] in meta:
                kept.append(s)
            continue
        m = _NAME_END.search(s)
        if (s[: m.start()] if m else s) in keep:
            kept.append(s)
    return "\n".join(kept)


def parse_exposition(text: str, keep: Collection[str] | None = None, page: bool = False) -> Exposition:
    """Parse a text exposition; :class:`ExpositionError` if it is not valid (``page``: a scraped page, which
    must also be whole: see the module docstring).

    >>> parse_exposition("node_load1 0.2\\nnode_load1 0.3\\n")
    Traceback (most recent call last):
    ...
    app.bridge.errors.ExpositionError: invalid exposition: series node_load1 given twice
    >>> parse_exposition("node_load1 0.2\\nnode_memory_Cach", keep={"node_load1"}, page=True)  # cut in a line not read
    Traceback (most recent call last):
    ...
    app.bridge.errors.ExpositionError: invalid exposition: the page is cut short (its last line has no line feed)
    """
    cut = page and bool(text) and not text.endswith("\n")  # said once it has samples (a page of none is not one)
    if keep is not None:
        text = filter_lines(text, keep)
    if sum(1 for line in text.split("\n") if line and line[0] != "#") > MAX_SERIES:  # before the parser holds them
        raise ExpositionError(f"invalid exposition: more than {MAX_SERIES} series of the metrics read")
    declared_counters = set(_COUNTER_TYPE.findall(text))
    samples: dict[str, list[Sample]] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    try:
        for family in text_string_to_metric_families(text):
            restore = family.type == "counter" and family.name in declared_counters
            for s in family.samples:
                name = s.name
                if restore and name == family.name + "_total" and name not in declared_counters:
                    name = family.name
                series = (name, tuple(sorted(s.labels.items())))
                if series in seen:
                    raise ExpositionError(f"invalid exposition: series {_show(series)} given twice")
                seen.add(series)
                samples.setdefault(name, []).append(Sample(name, s.labels, float(s.value)))
    except ExpositionError:
        raise
    except Exception as exc:  # the parser raises ValueError, IndexError, TypeError ... on bad input
        raise ExpositionError(f"invalid exposition: {type(exc).__name__}: {exc}") from None
    if cut and samples:
        raise ExpositionError("invalid exposition: the page is cut short (its last line has no line feed)")
    return Exposition(samples)


def _show(series: tuple[str, tuple[tuple[str, str], ...]]) -> str:
    name, labels = series
    shown = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else "")
    return shown[:200]
