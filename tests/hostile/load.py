"""The hostile-load run (issue 15): the floods of the issue against one real ``tc-server run`` process,
while a well-behaved client runs NEW_TXN + END_TXN pairs; prints the server's peak RSS and the
well-behaved client's outcome and latency. ``make hostile-load`` (mk/fuzz.mk) runs it.

    python -m tests.hostile.load [--seconds 60] [--store embedded] [--memory-limit-mib 256]

Token authentication is on: the floods run as the role ``flood``, the well-behaved client as ``app``.
That is what lets the server tell them apart: a role past --max-open-transactions-per-principal gets
NotAllowedError while the others are served. Without authentication every client is the same nobody,
and a flood that fills a coordinator's --max-active-transactions-per-coordinator refuses everyone's
NEW_TXN on it (measured: 41 of the well-behaved client's 303 NEW_TXN refused in 60 s).

Floods, all at once:
  * stalled frames: connections that send a frame header announcing the largest frame allowed and
    most of its body, then nothing;
  * pipelining: connections that send thousands of NEW_TXN and never read an answer;
  * connections: more than --max-connections, held open;
  * open transactions: NEW_TXN with a one-hour timeout, never ended, up to the per-role cap.

The server runs under a real memory limit, the 256 MiB the deploy manifests set
(deploy/kubernetes/*/: resources.limits.memory), in a memory cgroup of its own
(tc_server/bench/memory_limit.py): past it the kernel OOM-kills it, as Kubernetes would. Where no memory
cgroup can be created the run says so and goes on without a limit. The RSS is read from /proc (VmRSS,
VmHWM); the group's peak charge (page cache included) and its OOM kills are printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import statistics
import struct
import tempfile
import time
from pathlib import Path

from tc_server.bench.memory_limit import MIB, MemoryLimit, MemoryLimitUnavailable, open_memory_limit
from tc_server.bench.process import ServerStopError, TcServerProcess
from tc_server.client import ClientAuth, TcClient, connect, connect_command
from tc_server.wire import NewTxn, encode_command
from tests.security.pki import make_token

K8S_MEMORY_LIMIT_MIB = 256


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


# The HS256 key of this run and the two roles' credentials.
SECRET = os.urandom(32)
FLOOD = ClientAuth("token", make_token(SECRET, "HS256", "flood", expires_in_s=None).encode())
APP = ClientAuth("token", make_token(SECRET, "HS256", "app", expires_in_s=None).encode())


async def raw_connection(port: int, handshake: bool = True,
                         source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    if handshake:
        writer.write(encode_command(connect_command(FLOOD)))
        await writer.drain()
    return reader, writer


async def stalled_frames(port: int, count: int, frame_limit: int, held: list[asyncio.StreamWriter]) -> None:
    for _ in range(count):
        with contextlib.suppress(OSError):
            _, writer = await raw_connection(port)
            writer.write(struct.pack(">II", frame_limit, frame_limit - 4) + b"\0" * (frame_limit * 3 // 4))
            held.append(writer)


async def pipeliners(port: int, count: int, per_connection: int, held: list[asyncio.StreamWriter]) -> None:
    batch = b"".join(encode_command(NewTxn(i + 1, 60_000, i % 16)) for i in range(per_connection))
    for _ in range(count):
        with contextlib.suppress(OSError):
            _, writer = await raw_connection(port)
            writer.write(batch)  # and never read an answer
            held.append(writer)


async def connection_flood(port: int, count: int, held: list[asyncio.StreamWriter]) -> None:
    # From many loopback addresses (127.0.1.x), so that --max-connections is reached, not only
    # --max-connections-per-address.
    for i in range(count):
        with contextlib.suppress(OSError):
            _, writer = await raw_connection(port, handshake=False, source=f"127.0.1.{1 + i % 250}")
            held.append(writer)


async def open_txn_flood(port: int, total: int, opened: list[int]) -> None:
    client = await connect("127.0.0.1", port, auth=FLOOD)
    try:
        for start in range(0, total, 500):
            answers = await asyncio.gather(*(client.new_txn(tc_id=i % 16, ttl_ms=3_600_000)
                                             for i in range(start, min(total, start + 500))))
            opened[0] += sum(a.error is None for a in answers)
    finally:
        client.close()


async def polite_client(port: int, stop: asyncio.Event, latencies: list[float], failures: list[str]) -> None:
    client: TcClient = await connect("127.0.0.1", port, auth=APP)
    try:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                opened = await client.request(NewTxn(client.next_request_id(), 60_000, 5), timeout_s=30)
                if opened.error is not None:
                    failures.append(f"NEW_TXN {opened.error.name}")
                    continue
                ended = await client.end_txn(5, opened.least, commit=True)
                if ended.error is not None:
                    failures.append(f"END_TXN {ended.error.name}")
                    continue
            except Exception as exc:  # noqa: BLE001 - a failure is a finding, reported below
                failures.append(repr(exc))
                continue
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.05)
    finally:
        client.close()


async def run(seconds: float, store: str, limit: MemoryLimit | None) -> int:
    with tempfile.TemporaryDirectory(prefix="tc-hostile-") as workdir:
        key = "data:;base64," + base64.b64encode(SECRET).decode()
        server = TcServerProcess(Path(workdir) / "data", "--authentication-providers", "token",
                                 "--token-secret-key", key, store=store)
        if limit is not None:
            server.command = limit.wrap(server.command)
        server.start()
        assert server.proc is not None
        pid = server.proc.pid
        held: list[asyncio.StreamWriter] = []
        latencies: list[float] = []
        failures: list[str] = []
        peak = 0.0
        probes_failed = 0
        stop = asyncio.Event()
        opened = [0]
        try:
            polite = asyncio.create_task(polite_client(server.port, stop, latencies, failures))
            floods = [
                asyncio.create_task(stalled_frames(server.port, 200, 256 * 1024, held)),
                asyncio.create_task(pipeliners(server.port, 100, 10_000, held)),
                asyncio.create_task(connection_flood(server.port, 4500, held)),
                asyncio.create_task(open_txn_flood(server.port, 200_000, opened)),
            ]
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                peak = max(peak, rss_mib(pid)[0])
                probes_failed += await asyncio.to_thread(server.status, "/readyz") != 200
                await asyncio.sleep(0.5)
            stop.set()
            await polite
            for task in floods:
                task.cancel()
            await asyncio.gather(*floods, return_exceptions=True)
            rss, hwm = rss_mib(pid)
            try:
                exposition = (await asyncio.to_thread(server.get, "/metrics", 30.0))[1].decode()
            except OSError as exc:
                exposition = f"tc_server_connections_refused_total: /metrics did not answer ({exc!r})"
            refused = [line for line in exposition.splitlines()
                       if line.startswith("tc_server_connections_refused_total")
                       or (line.startswith("tc_server_request_errors_total") and "NotAllowedError" in line)]
        finally:
            for writer in held:
                writer.close()
            stop_started = time.monotonic()
            alive = server.running()
            try:
                server.stop()
                stop_note = f"graceful stop took {time.monotonic() - stop_started:.1f} s"
            except ServerStopError:
                stop_note = "the graceful stop did not finish within its bound; killed"
            if not alive:
                stop_note = f"the server had exited before the end (exit code {server.proc.returncode})"
    lat = sorted(latencies)
    oom_kills = limit.oom_kills() if limit is not None else 0
    print(f"hostile load, {seconds:.0f} s, store {store}:")
    print(f"  server RSS: peak sampled {peak:.0f} MiB, high-water mark {hwm:.0f} MiB, at the end {rss:.0f} MiB "
          f"(Kubernetes limit {K8S_MEMORY_LIMIT_MIB} MiB)")
    if limit is not None:
        print(f"  under {limit.describe()}: the group's peak charge {limit.peak_bytes() / MIB:.0f} MiB (page cache "
              f"included), OOM kills {oom_kills}")
    print(f"  well-behaved client: {len(lat)} pairs ok, {len(failures)} failed {sorted(set(failures))[:5]}; "
          f"pair latency p50 {statistics.median(lat) * 1000:.1f} ms, max {lat[-1] * 1000:.1f} ms" if lat else
          f"  well-behaved client: no pair succeeded; failures {sorted(set(failures))[:5]}")
    print(f"  /readyz not 200 in {probes_failed} samples; open txns created by the flood: {opened[0]}")
    print("  " + "; ".join(refused))
    print(f"  {stop_note}")
    return 0 if not failures and not oom_kills and hwm < K8S_MEMORY_LIMIT_MIB else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--store", default="embedded")
    parser.add_argument("--memory-limit-mib", type=int, default=K8S_MEMORY_LIMIT_MIB,
                        help="run the server in a memory cgroup of this limit (0: none)")
    args = parser.parse_args()
    limit = None
    if args.memory_limit_mib:
        try:
            limit = open_memory_limit(args.memory_limit_mib * MIB, name=f"tc-server-hostile-{os.getpid()}")
        except MemoryLimitUnavailable as exc:
            print(f"NO MEMORY LIMIT ENFORCED: {exc}")
    try:
        return asyncio.run(run(args.seconds, args.store, limit))
    finally:
        if limit is not None:
            limit.close()


if __name__ == "__main__":
    raise SystemExit(main())
