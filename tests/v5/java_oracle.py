"""Runs a snippet of Java against the Pulsar 5.0.0-M1 broker jars (``make pulsar-broker5``): Pulsar's own code
as the oracle for the bytes tc-server writes (tests/v5/test_v5_serializer_bytes.py, test_event_fanout.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.v5.broker5 import BROKER5_LIB, find_java21


def run_java(tmp_path: Path, class_name: str, source: str, stdin: str = "") -> list[str]:
    """Compile ``source`` (a public class ``class_name``) against the broker jars, run it, return its stdout lines."""
    assert Path(BROKER5_LIB).exists(), f"no Pulsar 5 broker jars in {BROKER5_LIB}: run make pulsar-broker5"
    java = find_java21()
    javac = str(Path(java).with_name("javac"))
    (tmp_path / f"{class_name}.java").write_text(source)
    classpath = f"{BROKER5_LIB}/*"
    subprocess.run([javac, "-cp", classpath, f"{class_name}.java"], cwd=tmp_path, check=True, timeout=180)
    run = subprocess.run([java, "-cp", f"{classpath}:{tmp_path}", class_name], cwd=tmp_path, check=True,
                         input=stdin, capture_output=True, text=True, timeout=180)
    return run.stdout.split("\n")[:-1]


def utf16_hex(text: str) -> str:
    """``text`` as hex UTF-16 code units (a Java String can then be rebuilt exactly, lone surrogates too)."""
    return "".join(f"{ord(c):04x}" if ord(c) < 0x10000 else
                   f"{0xD800 + ((ord(c) - 0x10000) >> 10):04x}{0xDC00 + ((ord(c) - 0x10000) & 0x3FF):04x}"
                   for c in text)


JAVA_DECODE = """
  static String dec(String hex) {
    StringBuilder b = new StringBuilder();
    for (int i = 0; i < hex.length(); i += 4) b.append((char) Integer.parseInt(hex.substring(i, i + 4), 16));
    return b.toString();
  }
"""
