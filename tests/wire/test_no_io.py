"""tc_server.wire is sans-IO: importing it must not pull in asyncio or socket (docs/architecture.md §9)."""

import subprocess
import sys

CHECK = """
import sys
import tc_server.wire
import tc_server.wire.codec, tc_server.wire.framing, tc_server.wire.commands, tc_server.wire.errors
leaked = sorted({"asyncio", "socket", "selectors", "ssl"} & set(sys.modules))
print(",".join(leaked))
"""


def test_wire_imports_no_io_modules() -> None:
    # A fresh interpreter: in this one, pytest and its plugins have long imported asyncio.
    result = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "", f"tc_server.wire imported {result.stdout.strip()}"
