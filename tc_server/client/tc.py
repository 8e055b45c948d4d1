"""A pipelining transaction-coordinator client on :class:`PulsarConnection`: what the tests and the load
generator speak. It sends exactly what a Java client sends to a coordinator (CONNECT, TC_CLIENT_CONNECT,
NEW_TXN, ADD_*, END_TXN) plus discovery, and returns answers that carry an error rather than raising,
so tests can look at the exact code, message and txnid_most_bits.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tc_server.client.connection import NO_AUTH, ClientAuth, PulsarConnection, connect_command
from tc_server.wire import (
    AddPartitionToTxn,
    AddSubscriptionToTxn,
    Command,
    Connected,
    EndTxn,
    EndTxnResponse,
    Error,
    Lookup,
    LookupResponse,
    NewTxn,
    NewTxnResponse,
    PartitionedMetadata,
    PartitionedMetadataResponse,
    Subscription,
    TcClientConnect,
    TcClientConnectResponse,
    TxnAction,
    WatchTcAssignments,
    WatchTcAssignmentsUpdate,
)

# Tests look at frames as big as a broker may send; the client itself never needs this much.
_TEST_MAX_FRAME = 64 * 1024 * 1024


class TcClient(PulsarConnection):
    """Use :func:`connect`. Pushed WATCH_TC_ASSIGNMENTS updates queue up in ``assignment_updates``;
    ERROR frames that answer no pending request are kept in ``errors``."""

    def __init__(self, url: str = "") -> None:
        super().__init__(url, keepalive_s=None, on_command=self._unsolicited, max_frame_size=_TEST_MAX_FRAME)
        self.errors: list[Error] = []
        self.assignment_updates: asyncio.Queue[WatchTcAssignmentsUpdate] = asyncio.Queue()

    def _unsolicited(self, cmd: Command, frame: bytes) -> None:
        if isinstance(cmd, WatchTcAssignmentsUpdate):
            self.assignment_updates.put_nowait(cmd)
        elif isinstance(cmd, Error):
            self.errors.append(cmd)

    async def handshake_as(self, protocol_version: int = 21, auth: ClientAuth = NO_AUTH) -> Connected:
        return await self.handshake(connect_command(auth, "tc-server-test-client", protocol_version))

    async def watch_assignments(self, watch_id: int) -> WatchTcAssignmentsUpdate:
        """Send WATCH_TC_ASSIGNMENTS; returns the first update (later ones queue up in ``assignment_updates``)."""
        self.send(WatchTcAssignments(watch_id))
        return await self.assignment_updates.get()

    async def partitioned_metadata(self, topic: str) -> PartitionedMetadataResponse:
        return await self.request(PartitionedMetadata(topic, self.next_request_id()))  # type: ignore[no-any-return]

    async def lookup(self, topic: str, authoritative: bool = False) -> LookupResponse:
        return await self.request(Lookup(topic, self.next_request_id(), authoritative))  # type: ignore[no-any-return]

    async def tc_client_connect(self, tc_id: int) -> TcClientConnectResponse:
        return await self.request(TcClientConnect(self.next_request_id(), tc_id))  # type: ignore[no-any-return]

    async def new_txn(self, tc_id: int, ttl_ms: int = 0) -> NewTxnResponse:
        return await self.request(NewTxn(self.next_request_id(), ttl_ms, tc_id))  # type: ignore[no-any-return]

    async def end_txn(self, most: int, least: int, commit: bool) -> EndTxnResponse:
        action = TxnAction.COMMIT if commit else TxnAction.ABORT
        return await self.request(EndTxn(self.next_request_id(), most, least, action))  # type: ignore[no-any-return]

    async def add_partition(self, most: int, least: int, topic: str) -> Any:
        return await self.request(AddPartitionToTxn(self.next_request_id(), most, least, (topic,)))

    async def add_subscription(self, most: int, least: int, topic: str, sub: str) -> Any:
        return await self.request(
            AddSubscriptionToTxn(self.next_request_id(), most, least, (Subscription(topic, sub),))
        )


async def connect(host: str, port: int, *, handshake: bool = True, protocol_version: int = 21,
                  auth: ClientAuth = NO_AUTH) -> TcClient:
    """A plain-TCP TcClient, handshaken unless ``handshake=False`` (tests that send garbage first)."""
    url = f"pulsar://{host}:{port}"
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(lambda: TcClient(url), host, port)
    if handshake:
        await client.handshake_as(protocol_version, auth)
    return client


async def connect_coordinators(host: str, port: int, coordinators: int, *,
                               auth: ClientAuth = NO_AUTH) -> list[TcClient]:
    """A client per coordinator, at index tcId, as Pulsar's clients find them: LOOKUP of each assign-topic
    partition at the service URL, then a connection to the URL it names (one per distinct URL; the service
    connection itself when it names the service). With ``--workers N`` that is each coordinator's worker.

    Raises ClientError when a LOOKUP fails, with the coordinator and the answer's error."""
    from tc_server.client.connection import Endpoint
    from tc_server.client.errors import ClientError
    from tc_server.server.discovery import ASSIGN_TOPIC, PARTITION_SUFFIX

    service = await connect(host, port, auth=auth)
    by_url: dict[str, TcClient] = {f"pulsar://{host}:{port}": service}
    routed: list[TcClient] = []
    for tc_id in range(coordinators):
        answer = await service.lookup(f"{ASSIGN_TOPIC}{PARTITION_SUFFIX}{tc_id}", authoritative=True)
        if answer.error is not None or not answer.broker_service_url:
            raise ClientError(f"pulsar://{host}:{port}",
                              f"LOOKUP of coordinator {tc_id}: {answer.error!r} {answer.message or ''}")
        url = answer.broker_service_url
        if url not in by_url:
            endpoint = Endpoint.parse(url)
            by_url[url] = await connect(endpoint.host, endpoint.port, auth=auth)
        routed.append(by_url[url])
    if service not in routed:  # it named other processes only (--workers N): not needed any more
        service.close()
    return routed
