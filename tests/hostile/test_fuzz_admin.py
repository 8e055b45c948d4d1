"""Fuzzing the admin port's parser and routes (issue 15): any request line, path, query and headers get
an HTTP answer below 500 (a malformed request 400, an unknown path 404), no traceback or error line is
logged, and the probes answer afterwards. Bounded in the suite; ``make fuzz-long`` raises the count."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from .test_fuzz_server import ANSWER_BOUND_S, FUZZ, ServerThread

PREFIX = "/admin/v3/transactions"
segments = st.text(alphabet=st.characters(codec="latin-1"), max_size=30) | st.integers().map(str) | st.sampled_from(
    ["", "0", "1", "-1", "²", "9" * 30, "%C2%B2", "%00", "..", "%2F"])
paths = st.one_of(
    st.builds(lambda a, b: f"{PREFIX}/transactionMetadata/{a}/{b}", segments, segments),
    st.builds(lambda a, b: f"{PREFIX}/abort/{a}/{b}", segments, segments),
    st.builds(lambda a: f"{PREFIX}/slowTransactions/{a}", segments),
    st.builds(lambda a: f"{PREFIX}/coordinatorStats?coordinatorId={a}", segments),
    st.builds(lambda a, b: f"{PREFIX}/slowTransactions/{a}?coordinatorId={b}", segments, segments),
    st.sampled_from(["/healthz", "/readyz", "/metrics", f"{PREFIX}/coordinators"]),
    st.builds(lambda a: "/" + a, segments),
)
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]) | st.text(
    alphabet=st.characters(codec="latin-1"), min_size=1, max_size=8)
headers = st.lists(st.tuples(st.sampled_from(["Content-Length", "Transfer-Encoding", "Host", "Authorization",
                                             "Connection", "X-Any"]),
                             st.text(alphabet=st.characters(codec="latin-1"), max_size=20)), max_size=4)


class AdminTarget:
    def __init__(self, thread: ServerThread, logged: list[Any]) -> None:
        self.thread, self.logged = thread, logged
        assert thread.app is not None
        self.port = thread.app.admin.port

    def __repr__(self) -> str:
        return f"AdminTarget(port={self.port})"


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdminTarget]:
    with structlog.testing.capture_logs() as logged:
        thread = ServerThread(tmp_path_factory.mktemp("fuzz-admin") / "data")
        thread.start()
        yield AdminTarget(thread, logged)
        thread.stop()


def exchange(port: int, request: bytes, wait_s: float = ANSWER_BOUND_S) -> bytes:
    """Send, then read until the server closes or ``wait_s`` passes without a byte (a request that
    announced more body than it sent is still waiting for it: no answer is due)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


# A request that waits for a body it will never get is left after this long.
PATIENCE_S = 2.0


@FUZZ
@given(method=methods, path=paths, header_list=headers, body=st.binary(max_size=40))
def test_any_request_is_answered_below_500(admin: AdminTarget, method: str, path: str,
                                           header_list: list[tuple[str, str]], body: bytes) -> None:
    head = (f"{method} {path} HTTP/1.1\r\nHost: tc\r\n" + "".join(f"{k}: {v}\r\n" for k, v in header_list)
            + "Connection: close\r\n")
    raw = exchange(admin.port, head.encode("latin-1") + b"\r\n" + body, PATIENCE_S)
    if raw:  # aiohttp may close at once on a request it cannot parse at all
        status_line = raw.split(b"\r\n", 1)[0]
        assert status_line.startswith(b"HTTP/1."), raw[:200]
        assert int(status_line.split(b" ")[1]) < 500, raw[:300]
    assert admin.thread.loop_errors == []
    bad = [e for e in admin.logged if e.get("exc_info") or e.get("log_level") in ("error", "critical")]
    assert bad == []
    assert exchange(admin.port, b"GET /healthz HTTP/1.1\r\nHost: tc\r\nConnection: close\r\n\r\n").startswith(
        b"HTTP/1.1 200")
