"""Transactions opened as a stock client opens them, each at the instance that leads its coordinator (LOOKUP
through tc-server's service port), for the tests of --workers and of real tc-server processes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager

from tc_server.client import TcClient, connect_coordinators
from tc_server.client.connection import NO_AUTH, ClientAuth


@asynccontextmanager
async def coordinator_clients(port: int, coordinators: int,
                              auth: ClientAuth = NO_AUTH) -> AsyncIterator[Callable[[int], Awaitable[TcClient]]]:
    """A function giving the client of the instance that leads a coordinator (LOOKUP at the service ``port``), its
    TC_CLIENT_CONNECT sent before its first use; every client closed on leaving."""
    routed = await connect_coordinators("127.0.0.1", port, coordinators, auth=auth)
    connected: set[int] = set()

    async def client_for(tc_id: int) -> TcClient:
        client = routed[tc_id]
        if tc_id not in connected:
            assert (await client.tc_client_connect(tc_id)).error is None
            connected.add(tc_id)
        return client

    try:
        yield client_for
    finally:
        for client in {id(c): c for c in routed}.values():
            client.close()


async def txns_on_coordinators(port: int, coordinators: int, tc_ids: Iterable[int], *, commit: bool | None = True,
                               ttl_ms: int = 600_000, auth: ClientAuth = NO_AUTH) -> list[tuple[int, int]]:
    """A txn on each of ``tc_ids`` (an id again for another), in that order, then committed, aborted
    (``commit`` False) or left open (None); their (most, least). ``auth``: the clients' credentials."""
    async with coordinator_clients(port, coordinators, auth) as client_for:
        ids = []
        for tc_id in tc_ids:
            client = await client_for(tc_id)
            opened = await client.new_txn(tc_id=tc_id, ttl_ms=ttl_ms)
            assert opened.error is None and opened.most == tc_id, opened
            if commit is not None:
                ended = await client.end_txn(opened.most, opened.least, commit=commit)
                assert ended.error is None, ended
            ids.append((opened.most, opened.least))
        return ids


async def end_txns(port: int, coordinators: int, ids: Iterable[tuple[int, int]], *, commit: bool = True,
                   auth: ClientAuth = NO_AUTH) -> None:
    """END_TXN (commit, or abort with ``commit`` False) for each (most, least) of ``ids``, at the instance that
    leads its coordinator, each answered without an error."""
    async with coordinator_clients(port, coordinators, auth) as client_for:
        for most, least in ids:
            ended = await (await client_for(most)).end_txn(most, least, commit=commit)
            assert ended.error is None, ended
