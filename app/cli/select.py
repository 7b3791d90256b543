"""``rttsched select``: consensus feature selection over a file of training samples, per app.

Input is either a CSV file (header row; numeric columns are candidate features, other columns are ignored
except the app column) or JSON lines of training-samples messages (each checked against the topic contract;
its ``features`` map becomes columns, ``input_size_mb`` becomes ``task_input_size_mb``, and of the other
fields only the identifiers and ``rtt_ms`` are kept). Empty cells and
``nan`` are missing values, dropped pairwise per feature. A line with fewer or more cells than the header, or a
header naming a column twice, is refused; a UTF-8 byte-order mark (an Excel export) is read past. Names from
the file are printed with control characters escaped; the ``--json`` report keeps them as they are.
"""

from __future__ import annotations

import argparse
import codecs
import csv
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.errors import RttError

HELP = "score candidate features against RTT with five measures and print the consensus per app"
ALL_APPS = "*"
# top-level fields of a training-samples message kept beside its features (the rest would leak the target)
JSONL_FIELDS = ("model_key", "task_id", "app", "node", "node_class", "gpu_model", "rtt_ms")


class SelectInputError(RttError):
    """The input file or the options cannot be used (missing file or column, bad value, bad rule)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, type=Path, help="training samples: FILE.csv or FILE.jsonl")
    p.add_argument("--target", default="rtt_ms", help="column holding the RTT (default rtt_ms)")
    p.add_argument("--app-column", default="app", help="column to group by (default app; '' = one group)")
    p.add_argument("--min-votes", type=int, default=3, help="votes (of 5 measures) a feature needs (default 3)")
    p.add_argument("--top-k", type=int, default=None, help="a measure votes only for its K strongest features")
    p.add_argument("--threshold", action="append", default=[], metavar="MEASURE=VALUE",
                   help="override one measure's threshold, e.g. mic=0.3 (repeatable)")
    p.add_argument("--json", type=Path, default=None, help="also write the full report as JSON here")


def _number(raw: str) -> float | None:
    """float of a cell, NaN for an empty one, None when it is not a number."""
    text = raw.strip()
    if not text:
        return math.nan
    try:
        return float(text)
    except ValueError:
        return None


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of a CSV file with a header; each line must have as many cells as the header has columns."""
    with path.open(newline="", encoding="utf-8-sig") as fh:  # -sig: an Excel export's byte-order mark
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise SelectInputError(f"{path}: empty file or no header row")
        seen: set[str] = set()
        for name in header:
            if name in seen:
                raise SelectInputError(f"{path}:{reader.line_num}: column {name!r} is named twice in the header")
            seen.add(name)
        rows: list[dict[str, Any]] = []
        for cells in reader:
            if not cells:  # a blank line
                continue
            if len(cells) > len(header):
                raise SelectInputError(f"{path}:{reader.line_num}: more cells than header columns")
            if len(cells) < len(header):
                raise SelectInputError(f"{path}:{reader.line_num}: fewer cells than header columns "
                                       f"({len(cells)} of {len(header)})")
            parsed: dict[str, Any] = {}
            for key, raw in zip(header, cells, strict=True):
                value = _number(raw)
                parsed[key] = raw if value is None else value
            rows.append(parsed)
    return rows


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    from app.contracts import decode
    from app.errors import ContractError

    rows: list[dict[str, Any]] = []
    with path.open("rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if lineno == 1:
                line = line.removeprefix(codecs.BOM_UTF8)
            if not line.strip():
                continue
            try:
                msg = decode("training-samples", line)
            except ContractError as exc:
                raise SelectInputError(f"{path}:{lineno}: not a training-samples message: {exc}") from None
            row: dict[str, Any] = {k: msg[k] for k in JSONL_FIELDS if k in msg}
            row.update(msg["features"])
            if msg.get("input_size_mb") is not None:
                row.setdefault("task_input_size_mb", float(msg["input_size_mb"]))
            rows.append(row)
    return rows


def read_samples(path: Path) -> list[dict[str, Any]]:
    """Rows of a CSV or JSON-lines file (chosen by suffix: .jsonl/.json/.ndjson, else CSV)."""
    if path.is_dir():
        raise SelectInputError(f"{path}: is a directory, not a file")
    if not path.exists():
        raise SelectInputError(f"{path}: no such file")
    if not path.is_file():
        raise SelectInputError(f"{path}: not a regular file")
    try:
        rows = read_jsonl(path) if path.suffix.lower() in (".jsonl", ".json", ".ndjson") else read_csv(path)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SelectInputError(f"{path}: cannot read: {exc}") from None
    if not rows:
        raise SelectInputError(f"{path}: no samples")
    return rows


def _groups(rows: list[dict[str, Any]], app_column: str, path: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    if not app_column:
        yield ALL_APPS, rows
        return
    if all(app_column not in r for r in rows):
        raise SelectInputError(f"{path}: no column {app_column!r} (use --app-column '' for a single group)")
    by_app: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_app.setdefault(str(r.get(app_column, "")), []).append(r)
    yield from sorted(by_app.items())


def _features(rows: list[dict[str, Any]], exclude: set[str]) -> list[str]:
    """Columns whose every present value is a number (bools and strings make a column non-numeric)."""
    names: dict[str, bool] = {}
    for r in rows:
        for k, v in r.items():
            numeric = isinstance(v, int | float) and not isinstance(v, bool)
            names[k] = names.get(k, True) and numeric
    return sorted(k for k, ok in names.items() if ok and k not in exclude)


def _rule(args: argparse.Namespace) -> Any:
    from app.features.measures import MEASURES
    from app.features.selection import DEFAULT_THRESHOLDS, SelectionRule

    thresholds = dict(DEFAULT_THRESHOLDS)
    for item in args.threshold:
        measure, sep, value = item.partition("=")
        if not sep or measure not in MEASURES or _number(value) is None:
            raise SelectInputError(f"--threshold {item!r}: expected MEASURE=VALUE, MEASURE one of {list(MEASURES)}")
        thresholds[measure] = float(value)
    try:
        return SelectionRule(thresholds=thresholds, top_k=args.top_k, min_votes=args.min_votes)
    except ValueError as exc:
        raise SelectInputError(f"bad selection rule: {exc}") from None


def _shown(result: Any) -> Any:
    """``result`` with its feature names as :func:`~app.cli.output.printable` shows them, for its table."""
    import dataclasses

    from app.cli.output import printable

    if all(name.isprintable() for name in result.scores):
        return result
    return dataclasses.replace(
        result, chosen=tuple(map(printable, result.chosen)), degenerate=tuple(map(printable, result.degenerate)),
        **{field: {printable(k): v for k, v in getattr(result, field).items()}
           for field in ("scores", "signed", "votes", "strongest")})


def run(args: argparse.Namespace, settings: Any) -> int:
    import json

    import numpy as np

    from app.cli.flags import writable_file
    from app.cli.output import printable
    from app.errors import ConfigError
    from app.features.selection import render_shares, render_table, select_features, strongest_share

    rule = _rule(args)
    if args.json is not None:  # before the work: a report it cannot write fails now, not after every table
        if args.json.resolve() == args.input.resolve():
            raise ConfigError("--json", f"{args.json} is the --input file")
        writable_file(args.json, "--json")
    rows = read_samples(args.input)
    if all(args.target not in r for r in rows):
        raise SelectInputError(f"{args.input}: no column {args.target!r} (the target)")
    results = {}
    for app, group in _groups(rows, args.app_column, args.input):
        names = _features(group, {args.target, args.app_column})
        if not names:
            raise SelectInputError(f"{args.input}: app {app!r} has no numeric feature columns")
        target = [r.get(args.target, math.nan) for r in group]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in target):
            raise SelectInputError(f"{args.input}: target {args.target!r} has non-numeric values (app {app!r})")
        X = np.array([[r.get(n, math.nan) for n in names] for r in group], dtype=np.float64)
        shown = printable(app)
        print(f"measuring {shown}: {len(group)} samples x {len(names)} features ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        results[app] = select_features(X, np.asarray(target, dtype=np.float64), names, rule)
        print(f"  done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        res = results[app]
        print(render_table(_shown(res), title=f"== {shown}: {res.n_samples} samples, {len(names)} features, "
                                              f"{len(res.chosen)} chosen (>= {rule.min_votes} votes)"))
        print()
    shares = strongest_share(results)
    print("== strongest measure per app (% of chosen features)")
    print(render_shares({printable(app): row for app, row in shares.items()}))
    if args.json is not None:
        report = {"input": str(args.input), "target": args.target, "app_column": args.app_column,
                  "apps": {a: r.to_dict() for a, r in results.items()}, "strongest_share": shares}
        try:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
        except OSError as exc:
            raise SelectInputError(f"{args.json}: cannot write: {exc}") from None
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
