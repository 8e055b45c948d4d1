"""The Oxia stand-in's GetSequenceUpdates, which Pulsar 5's participants use to wait for events.

tests/v5/test_v5_sdk_e2e.py needs it (a broker without it never applies a decision); here it is checked
on its own, in process, with raw protobuf bytes as Oxia's Java client 0.8.0 sends them
(GetSequenceUpdatesRequest {1: shard, 2: key}, GetSequenceUpdatesResponse {1: highest_sequence_key}).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tc_server.store.oxia import connect as connect_oxia
from tests.oxia_standin.server import OXIA_SERVICE, serve

pytestmark = pytest.mark.timeout(60)

METHOD = f"/{OXIA_SERVICE}/GetSequenceUpdates"
PREFIX = "/txn/segment-events/segment%3A%2F%2Fpublic%2Fdefault%2Ft%2F0"


def request(shard: int, key: str) -> bytes:
    encoded = key.encode()
    assert shard < 0x80 and len(encoded) < 0x80  # one-byte varints are enough here
    return bytes([0x08, shard, 0x12, len(encoded)]) + encoded


def response_key(data: bytes) -> str:
    assert data[0] == 0x0A and data[1] < 0x80, data
    return data[2:2 + data[1]].decode()


async def test_sends_the_highest_sequence_key_now_and_after_each_put() -> None:
    async with serve(1) as oxia:
        store = await connect_oxia(oxia.address, request_timeout_s=10.0)
        channel = grpc.aio.insecure_channel(oxia.address)
        try:
            first = await store.put_sequential(PREFIX, b"{}", partition_key="p")
            call = channel.unary_stream(METHOD)(request(0, PREFIX))
            assert response_key(await asyncio.wait_for(call.read(), 10)) == first.key
            second = await store.put_sequential(PREFIX, b"{}", partition_key="p")
            await store.put(PREFIX + "x", b"other key, no update")
            assert response_key(await asyncio.wait_for(call.read(), 10)) == second.key
            assert second.key == PREFIX + "-00000000000000000002"
            call.cancel()
        finally:
            await channel.close()
            await store.close()


async def test_a_malformed_request_is_refused_with_invalid_argument() -> None:
    async with serve(1) as oxia:
        channel = grpc.aio.insecure_channel(oxia.address)
        try:
            for bad in (bytes([0x08, 7, 0x12, 1]) + b"k", bytes([0x0B]), bytes([0x08, 0x80])):
                call = channel.unary_stream(METHOD)(bad)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await asyncio.wait_for(call.read(), 10)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
        finally:
            await channel.close()
