"""Small inline-SVG charts for the audit report: no JavaScript, no network, no plotting library.

Each function returns one ``<svg>`` element as a string; every label goes through :func:`escape`.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence

# Colour-blind-safe (Okabe–Ito) series colours.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
STATE_COLOURS = {"OPEN": "#E69F00", "COMMITTED": "#009E73", "ABORTED": "#D55E00"}

# What XML 1.0 cannot hold in text at all, escaped or not: C0 controls but tab, LF and CR, lone
# surrogates, U+FFFE and U+FFFF.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")

_W, _H = 720, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 16, 56


def escape(text: str) -> str:
    """``text`` for a chart's text and attributes. Labels come from the store (a state or a segment name is
    any JSON string): html.escape left control characters in place, and the chart was no longer XML."""
    return html.escape(_NOT_XML.sub("\ufffd", text))


def colour(name: str, index: int) -> str:
    return STATE_COLOURS.get(name, PALETTE[index % len(PALETTE)])


def _nice_max(value: float) -> float:
    """The smallest 1/2/5 x 10^k at or above ``value`` (a readable top for the y axis)."""
    if value <= 0:
        return 1.0
    magnitude = 10 ** (len(str(int(value))) - 1)
    for step in (1, 2, 5, 10):
        if step * magnitude >= value:
            return float(step * magnitude)
    return float(10 * magnitude)


def _fmt(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1_000:
        return f"{value / 1_000:g}k"
    return f"{value:g}"


def _frame(title: str, body: list[str], y_max: float, legend: Sequence[tuple[str, str]]) -> str:
    plot_h = _H - _TOP - _BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
        f'role="img" aria-label="{escape(title)}" font-family="sans-serif" font-size="11">',
        f"<title>{escape(title)}</title>",
    ]
    for i in range(5):
        value = y_max * i / 4
        y = _TOP + plot_h - plot_h * i / 4
        parts.append(f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(_fmt(value))}</text>')
    parts.extend(body)
    x = _LEFT
    for name, fill in legend:
        parts.append(f'<rect x="{x}" y="{_H - 14}" width="10" height="10" fill="{fill}"/>')
        parts.append(f'<text x="{x + 14}" y="{_H - 5}">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    parts.append("</svg>")
    return "\n".join(parts)


def _x_label(x: float, y: float, text: str) -> str:
    return f'<text x="{x:.1f}" y="{y}" text-anchor="middle">{escape(text)}</text>'


def empty(title: str, message: str = "no data") -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="60" font-family="sans-serif" '
        f'font-size="12"><title>{escape(title)}</title>'
        f'<text x="10" y="35">{escape(message)}</text></svg>'
    )


def stacked_bars(title: str, categories: Sequence[str], series: Mapping[str, Sequence[float]]) -> str:
    """One bar per category, stacked by series (e.g. state counts per coordinator)."""
    if not categories:
        return empty(title)
    totals = [sum(values[i] for values in series.values()) for i in range(len(categories))]
    y_max = _nice_max(max(totals))
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    slot = plot_w / len(categories)
    bar = max(slot * 0.8, 1.0)
    body: list[str] = []
    for i, category in enumerate(categories):
        x = _LEFT + i * slot + (slot - bar) / 2
        base = 0.0
        for s, (name, values) in enumerate(series.items()):
            h = plot_h * values[i] / y_max
            y = _TOP + plot_h - plot_h * base / y_max - h
            body.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="{colour(name, s)}">'
                f"<title>{escape(category)} {escape(name)}: {values[i]:,.0f}</title></rect>"
            )
            base += values[i]
        if len(categories) <= 40 or i % max(1, len(categories) // 20) == 0:
            body.append(_x_label(x + bar / 2, _TOP + plot_h + 14, category))
    legend = [(name, colour(name, s)) for s, name in enumerate(series)]
    return _frame(title, body, y_max, legend)


def grouped_bars(title: str, categories: Sequence[str], series: Mapping[str, Sequence[float]]) -> str:
    """Bars side by side per category (e.g. latency buckets per terminal state)."""
    if not categories:
        return empty(title)
    y_max = _nice_max(max((v for values in series.values() for v in values), default=0))
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    slot = plot_w / len(categories)
    bar = max(slot * 0.8 / max(len(series), 1), 1.0)
    body: list[str] = []
    for i, category in enumerate(categories):
        x0 = _LEFT + i * slot + slot * 0.1
        for s, (name, values) in enumerate(series.items()):
            h = plot_h * values[i] / y_max
            x = x0 + s * bar
            body.append(
                f'<rect x="{x:.1f}" y="{_TOP + plot_h - h:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{colour(name, s)}">'
                f"<title>{escape(category)} {escape(name)}: {values[i]:,.0f}</title></rect>"
            )
        body.append(
            f'<text x="{_LEFT + i * slot + slot / 2:.1f}" y="{_TOP + plot_h + 14}" text-anchor="middle" '
            f'font-size="9">{escape(category)}</text>'
        )
    legend = [(name, colour(name, s)) for s, name in enumerate(series)]
    return _frame(title, body, y_max, legend)


def lines(title: str, x_labels: Sequence[str], series: Mapping[str, Sequence[float]]) -> str:
    """One polyline per series over evenly spaced x points (e.g. throughput per minute)."""
    if not x_labels:
        return empty(title)
    y_max = _nice_max(max((v for values in series.values() for v in values), default=0))
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    step = plot_w / max(len(x_labels) - 1, 1)
    body: list[str] = []
    for s, (name, values) in enumerate(series.items()):
        points = " ".join(
            f"{_LEFT + i * step:.1f},{_TOP + plot_h - plot_h * v / y_max:.1f}" for i, v in enumerate(values)
        )
        stroke = colour(name, s)
        body.append(f'<polyline points="{points}" fill="none" stroke="{stroke}" stroke-width="1.5"/>')
    every = max(1, len(x_labels) // 8)
    for i in range(0, len(x_labels), every):
        body.append(_x_label(_LEFT + i * step, _TOP + plot_h + 14, x_labels[i]))
    legend = [(name, colour(name, s)) for s, name in enumerate(series)]
    return _frame(title, body, y_max, legend)


def horizontal_bars(title: str, items: Sequence[tuple[str, float]], unit: str = "") -> str:
    """One labelled horizontal bar per item, longest first as given (e.g. pinning age per segment)."""
    if not items:
        return empty(title, "no OPEN transaction holds ops on any segment")
    row = 18
    label_w = 330
    height = _TOP + row * len(items) + 24
    v_max = max(v for _, v in items) or 1.0
    plot_w = _W - label_w - _RIGHT - 70
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" viewBox="0 0 {_W} {height}" '
        f'role="img" aria-label="{escape(title)}" font-family="sans-serif" font-size="11">',
        f"<title>{escape(title)}</title>",
    ]
    for i, (label, value) in enumerate(items):
        y = _TOP + i * row
        w = plot_w * value / v_max
        shown = label if len(label) <= 52 else "…" + label[-51:]
        parts.append(f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end">{escape(shown)}</text>')
        parts.append(
            f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{row - 5}" fill="{PALETTE[0]}">'
            f"<title>{escape(label)}: {value:,.0f}{escape(unit)}</title></rect>"
        )
        shown_value = escape(_fmt(value) + unit)
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 12}">{shown_value}</text>')
    parts.append("</svg>")
    return "\n".join(parts)
