"""tc-server's PIP-473 writers against Pulsar 5's own serializer, run from the 5.0.0-M1 broker jar.

tests/coordinator/test_layout_golden.py checks hand-written golden bytes. This runs Pulsar's
``TxnMetadataStore.toJson`` (the ObjectMapper its coordinator writes with) and Java's
``URLEncoder`` (``Codec.encode``) on edge inputs and compares byte for byte with ``TxnHeader.to_json``,
``event_json``, ``TcLeader.to_json`` and ``enc``. Needs the broker jars (``make pulsar-broker5``) and a Java 21+
JDK, as the rest of tests/v5: missing, the test fails naming them."""

from __future__ import annotations

import json
from pathlib import Path

from tc_server.coordinator.layout import TcLeader, TxnHeader, TxnState, enc, event_json
from tests.v5.java_oracle import run_java

OWNERS = ["app-1", "a\u007fb", "a\u2028b", "a/b<c>&'", "\u00e9\u4e2d", "a\U0001F600b", "a\ud800b",
          "c\u0000\u0001\u001f\b\f\n\r\t\"\\", "x\u0080\u009fy", "\ufeff\ufffe\uffff"]
MILLIS = [0, 1, 10, 999, 1000, 1500, 60_000, 3_600_000, 1795447209230]
# Java literals of OWNERS (a Python str cannot hold the surrogate pair Java writes for U+1F600).
JAVA_OWNERS = ['"app-1"', '"a\\u007fb"', '"a\\u2028b"', '"a/b<c>&\'"', '"\\u00e9\\u4e2d"', '"a\\ud83d\\ude00b"',
               '"a\\ud800b"', '"c\\u0000\\u0001\\u001f\\b\\f\\n\\r\\t\\"\\\\"', '"x\\u0080\\u009fy"',
               '"\\ufeff\\ufffe\\uffff"']

JAVA = """
import org.apache.pulsar.broker.transaction.metadata.*;
import java.time.*; import java.util.HexFormat; import java.net.URLEncoder; import java.nio.charset.StandardCharsets;
public class V5Bytes { public static void main(String[] a) throws Exception {
  HexFormat hex = HexFormat.of();
  String[] owners = {%(owners)s};
  long[] millis = {%(millis)s};
  for (String o : owners) System.out.println(hex.formatHex(TxnMetadataStore.toJson(new TxnHeader(TxnState.ABORTED,
      Duration.ofMillis(60000), Instant.ofEpochMilli(1795447209230L), Instant.ofEpochMilli(1795447270000L), o))));
  for (long m : millis) System.out.println(hex.formatHex(TxnMetadataStore.toJson(new TxnHeader(TxnState.OPEN,
      Duration.ofMillis(m), Instant.ofEpochMilli(m), null, null))));
  System.out.println(hex.formatHex(TxnMetadataStore.toJson(new TxnEvent("3_17", TxnState.COMMITTED))));
  System.out.println(hex.formatHex(TxnMetadataStore.toJson(new TcLeader("tc-\\u00e9", "pulsar://h:1", null, null))));
  for (int c = 0; c < 0x800; c++) System.out.println(URLEncoder.encode("a" + (char) c + "b", StandardCharsets.UTF_8));
}}
"""


def python_lines() -> list[str]:
    out = [TxnHeader(TxnState.ABORTED, 1795447209230, 60_000, 1795447270000, o).to_json().hex() for o in OWNERS]
    out += [TxnHeader(TxnState.OPEN, m, m).to_json().hex() for m in MILLIS]
    out.append(event_json(3, 17, TxnState.COMMITTED).hex())
    out.append(TcLeader("tc-\u00e9", "pulsar://h:1").to_json().hex())
    out += [enc("a" + chr(c) + "b") for c in range(0x800)]
    return out


def test_writers_match_pulsar5_serializer_byte_for_byte(tmp_path: Path) -> None:
    java_lines = run_java(tmp_path, "V5Bytes", JAVA % {"owners": ", ".join(JAVA_OWNERS),
                                                      "millis": ", ".join(f"{m}L" for m in MILLIS)})
    ours = python_lines()
    assert len(java_lines) == len(ours)
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(ours, java_lines, strict=True)) if a != b]
    assert not differ, json.dumps(differ[:5])
