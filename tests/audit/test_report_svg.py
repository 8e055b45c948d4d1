"""The report's inline SVG charts with hostile strings from the store: html.escape left control characters
in place, and a chart holding one was no longer well-formed XML (found by a review)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from tc_server.audit import report


def _svgs(html: str) -> list[str]:
    out, start = [], 0
    while (start := html.find("<svg", start)) >= 0:
        end = html.index("</svg>", start) + len("</svg>")
        out.append(html[start:end])
        start = end
    return out


def test_control_characters_in_state_and_segment_keep_every_chart_well_formed_xml() -> None:
    # A header's state and an op's segment are any JSON string (exported verbatim, "\u0001" included).
    # html.escape leaves control characters alone, so the chart is not well-formed XML any more
    # (tests/audit/test_job.py::test_report_has_charts holds every chart to that).
    state, segment = "OPEN\x01<x>", "seg\x0b&"
    summary = {
        "snapshot": {"path": "snap", "source": "memory"},
        "params": {"now_ms": 1_767_225_600_000, "retention_s": 900, "gc_interval_s": 300, "grace_s": 60},
        "violations": {"illegal_headers": 1}, "export_rejects": 0, "latency_ms": {},
        "counts_by_state": {"OPEN": 0, "COMMITTED": 0, "ABORTED": 0, state: 1}, "total_txns": 1, "total_ops": 1,
    }
    data = report.ReportData(
        summary=summary,
        state_by_coordinator=[(0, state, 1)],
        pinning=[{"segment": segment, "oldest_age_ms": 5_000}],
    )
    html = report.render(data)
    bad = []
    for svg in _svgs(html):
        try:
            ET.fromstring(svg)
        except ET.ParseError as exc:
            bad.append(f"{svg[svg.find('<title>'):svg.find('</title>') + 8]}: {exc}")
    assert not bad, bad
