"""The audit's HTML report: one self-contained file, charts as inline SVG (no scripts, no network),
built from small, already collected results."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from tc_server.audit import svg

# More minutes than this are merged into wider buckets so the throughput chart stays readable.
_MAX_THROUGHPUT_POINTS = 240


@dataclass
class ReportData:
    summary: dict[str, Any]
    # (coordinator_id, state, txns)
    state_by_coordinator: list[tuple[int, str, int]] = field(default_factory=list)
    # (state, lower_ms, upper_ms, txns)
    latency_histogram: list[tuple[str, int, int, int]] = field(default_factory=list)
    # (minute_ms, created, committed, aborted)
    throughput: list[tuple[int, int, int, int]] = field(default_factory=list)
    # rows of the pinning table, oldest first
    pinning: list[dict[str, Any]] = field(default_factory=list)
    # finding -> first rows of its table
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _utc(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    columns = list(columns or rows[0].keys())
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(_cell(row.get(c)))}</td>" for c in columns) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def state_chart(rows: Sequence[tuple[int, str, int]]) -> str:
    coordinators = sorted({c for c, _, _ in rows})
    states = sorted({s for _, s, _ in rows}, key=lambda s: (s not in svg.STATE_COLOURS, s))
    counts = {(c, s): n for c, s, n in rows}
    series = {s: [float(counts.get((c, s), 0)) for c in coordinators] for s in states}
    return svg.stacked_bars("Transactions per coordinator, by state", [str(c) for c in coordinators], series)


def latency_chart(rows: Sequence[tuple[str, int, int, int]]) -> str:
    buckets = sorted({(lo, hi) for _, lo, hi, _ in rows})
    states = sorted({s for s, _, _, _ in rows})
    counts = {(s, lo): n for s, lo, _, n in rows}
    labels = [f"<{_duration(hi)}" for _, hi in buckets]
    series = {s: [float(counts.get((s, lo), 0)) for lo, _ in buckets] for s in states}
    title = "Commit/abort latency (finalized - created), power-of-two buckets"
    return svg.grouped_bars(title, labels, series)


def throughput_chart(rows: Sequence[tuple[int, int, int, int]]) -> str:
    if not rows:
        return svg.empty("Throughput per minute")
    rows = sorted(rows)
    first, last = rows[0][0], rows[-1][0]
    minutes = (last - first) // 60_000 + 1
    width = max(1, -(-minutes // _MAX_THROUGHPUT_POINTS))  # minutes per point, ceil
    points = (minutes + width - 1) // width
    created, committed, aborted = [0.0] * points, [0.0] * points, [0.0] * points
    for minute, c, co, ab in rows:
        i = (minute - first) // 60_000 // width
        created[i] += c
        committed[i] += co
        aborted[i] += ab
    labels = [_utc(first + i * width * 60_000)[11:16] for i in range(points)]
    title = "Transactions per minute" if width == 1 else f"Transactions per {width} minutes"
    return svg.lines(title, labels, {"created": created, "COMMITTED": committed, "ABORTED": aborted})


def pinning_chart(rows: Sequence[Mapping[str, Any]]) -> str:
    items = [(str(r["segment"]), float(r["oldest_age_ms"]) / 1000) for r in rows]
    return svg.horizontal_bars("Oldest OPEN txn per segment (age, s)", items, unit="s")


_STYLE = """
body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
.bad{color:#b00020;font-weight:bold}.ok{color:#00703c;font-weight:bold}
section{margin-bottom:2em}
"""


def render(data: ReportData) -> str:
    s = data.summary
    params = s["params"]
    violations: dict[str, int] = s["violations"]
    total = sum(violations.values())
    if total:
        verdict = f'<p class="bad">{total:,} violation(s) found.</p>'
    else:
        verdict = '<p class="ok">No violations found.</p>'
    rejected = s["export_rejects"]
    vrows = [{"finding": k, "count": v} for k, v in violations.items()]
    lat_rows = [{"state": state, **values} for state, values in s["latency_ms"].items()]
    state_rows = [{"state": k, "txns": v} for k, v in s["counts_by_state"].items()]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>Transaction audit</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>Transaction audit</h1>",
        f"<p>Snapshot <code>{escape(str(s['snapshot']['path']))}</code> "
        f"(source {escape(str(s['snapshot']['source']))}), audited as of {escape(_utc(params['now_ms']))}; "
        f"retention {params['retention_s']:,} s, GC every {params['gc_interval_s']:,} s, "
        f"grace {params['grace_s']:,} s. "
        f"{s['total_txns']:,} transactions, {s['total_ops']:,} op records"
        + (f", {rejected:,} malformed records left out by the export" if rejected else "")
        + ".</p>",
        verdict,
        "<section><h2>Violations</h2>",
        _table(vrows),
        "</section>",
        "<section><h2>Transactions by state</h2>",
        _table(state_rows),
        state_chart(data.state_by_coordinator),
        "</section>",
        "<section><h2>Commit/abort latency</h2>",
        _table(lat_rows),
        latency_chart(data.latency_histogram),
        "</section>",
        "<section><h2>Throughput over time</h2>",
        throughput_chart(data.throughput),
        "</section>",
        "<section><h2>Oldest pinning transactions per segment</h2>",
        "<p>The lowest position an OPEN transaction holds on a segment is as far as readers can go; "
        "informational, not a violation.</p>",
        pinning_chart(data.pinning),
        _table(data.pinning),
        "</section>",
    ]
    for name, rows in data.samples.items():
        if violations.get(name):
            parts.append(f"<section><h2>{escape(name)}: {violations[name]:,}</h2>")
            parts.append(f"<p>First {len(rows)} rows; the whole table is <code>{escape(name)}/</code>.</p>")
            parts.append(_table(rows))
            parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _duration(ms: float) -> str:
    """A bucket bound for an axis label: "512ms", "2s", "16.4s", "5min"."""
    if ms < 1000:
        return f"{ms:g}ms"
    if ms < 60_000:
        return f"{ms / 1000:.3g}s"
    return f"{ms / 60_000:.3g}min"
