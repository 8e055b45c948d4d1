"""Finding and reaching a coordinator: PARTITIONED_METADATA, LOOKUP, TC_CLIENT_CONNECT and PIP-473's
WATCH_TC_ASSIGNMENTS, with their answers (docs/pulsar-protocol.md §2, §3, §5)."""

from __future__ import annotations

from typing import Final

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.wire.codec.registry import (
    checked_count,
    checked_request_id,
    error_message,
    missing,
    no_body,
    opt_text,
    register,
    server_error,
    text,
    wire_request_id,
)
from tc_server.wire.commands import (
    Command,
    Lookup,
    LookupResponse,
    LookupType,
    PartitionedMetadata,
    PartitionedMetadataResponse,
    TcAssignment,
    TcAssignmentsSnapshot,
    TcClientConnect,
    TcClientConnectResponse,
    WatchTcAssignments,
    WatchTcAssignmentsClose,
    WatchTcAssignmentsUpdate,
)
from tc_server.wire.errors import ServerError

_Base = pb.BaseCommand


_LOOKUP_TYPES: Final = tuple(LookupType)
# CommandPartitionedTopicMetadataResponse.LookupType (docs/pulsar-protocol.md §2).
_PM_SUCCESS: Final = 0
_PM_FAILED: Final = 1


def _decode_partitioned_metadata(base: pb.BaseCommand) -> Command:
    if not base.HasField("partitionMetadata"):
        raise no_body(_Base.PARTITIONED_METADATA, "partitionMetadata")
    m = base.partitionMetadata
    request_id = checked_request_id(m, _Base.PARTITIONED_METADATA)
    if not m.HasField("topic"):
        raise missing(_Base.PARTITIONED_METADATA, "topic", request_id)
    return PartitionedMetadata(text(m.topic), request_id, m.metadata_auto_creation_enabled)


def _decode_partitioned_metadata_response(base: pb.BaseCommand) -> Command:
    if not base.HasField("partitionMetadataResponse"):
        raise no_body(_Base.PARTITIONED_METADATA_RESPONSE, "partitionMetadataResponse")
    m = base.partitionMetadataResponse
    request_id = checked_request_id(m, _Base.PARTITIONED_METADATA_RESPONSE)
    error = server_error(m, "error", 4)
    if error is None and m.HasField("response") and m.response == _PM_FAILED:
        error = ServerError.UnknownError
    return PartitionedMetadataResponse(request_id, m.partitions, error, opt_text(m, "message"))


def _decode_lookup(base: pb.BaseCommand) -> Command:
    if not base.HasField("lookupTopic"):
        raise no_body(_Base.LOOKUP, "lookupTopic")
    m = base.lookupTopic
    request_id = checked_request_id(m, _Base.LOOKUP)
    if not m.HasField("topic"):
        raise missing(_Base.LOOKUP, "topic", request_id)
    checked_count(m.properties, _Base.LOOKUP, "properties", request_id)
    return Lookup(text(m.topic), request_id, m.authoritative, opt_text(m, "advertised_listener_name"),
                  tuple((text(p.key), text(p.value)) for p in m.properties))


def _decode_lookup_response(base: pb.BaseCommand) -> Command:
    if not base.HasField("lookupTopicResponse"):
        raise no_body(_Base.LOOKUP_RESPONSE, "lookupTopicResponse")
    m = base.lookupTopicResponse
    request_id = checked_request_id(m, _Base.LOOKUP_RESPONSE)
    # No (or an unnamed) response value fails the lookup in the Java client; say so here too.
    response = _LOOKUP_TYPES[m.response] if m.HasField("response") else LookupType.FAILED
    return LookupResponse(
        request_id=request_id,
        response=response,
        broker_service_url=opt_text(m, "brokerServiceUrl"),
        broker_service_url_tls=opt_text(m, "brokerServiceUrlTls"),
        authoritative=m.authoritative,
        error=server_error(m, "error", 6),
        message=opt_text(m, "message"),
        proxy_through_service_url=m.proxy_through_service_url,
    )


def _decode_tc_assignment(m: pb.TcAssignment, code: int) -> TcAssignment:
    if not m.HasField("tc_id"):
        raise missing(code, "assignments.tc_id")
    return TcAssignment(m.tc_id, opt_text(m, "broker_service_url"), opt_text(m, "broker_service_url_tls"))


def _decode_watch(base: pb.BaseCommand) -> Command:
    if not base.HasField("watchTcAssignments"):
        raise no_body(_Base.WATCH_TC_ASSIGNMENTS, "watchTcAssignments")
    m = base.watchTcAssignments
    if not m.HasField("watch_id"):
        raise missing(_Base.WATCH_TC_ASSIGNMENTS, "watch_id")
    return WatchTcAssignments(m.watch_id)


def _decode_watch_update(base: pb.BaseCommand) -> Command:
    code = _Base.WATCH_TC_ASSIGNMENTS_UPDATE
    if not base.HasField("watchTcAssignmentsUpdate"):
        raise no_body(code, "watchTcAssignmentsUpdate")
    m = base.watchTcAssignmentsUpdate
    if not m.HasField("watch_id"):
        raise missing(code, "watch_id")
    snapshot = None
    if m.HasField("snapshot"):
        s = m.snapshot
        if not s.HasField("parallelism"):
            raise missing(code, "snapshot.parallelism")
        assignments = tuple(_decode_tc_assignment(a, code) for a in s.assignments)
        snapshot = TcAssignmentsSnapshot(s.parallelism, assignments)
    return WatchTcAssignmentsUpdate(
        m.watch_id, snapshot, server_error(m, "error", 3), opt_text(m, "message")
    )


def _decode_watch_close(base: pb.BaseCommand) -> Command:
    if not base.HasField("watchTcAssignmentsClose"):
        raise no_body(_Base.WATCH_TC_ASSIGNMENTS_CLOSE, "watchTcAssignmentsClose")
    m = base.watchTcAssignmentsClose
    if not m.HasField("watch_id"):
        raise missing(_Base.WATCH_TC_ASSIGNMENTS_CLOSE, "watch_id")
    return WatchTcAssignmentsClose(m.watch_id)


def _decode_tc_client_connect(base: pb.BaseCommand) -> Command:
    code = _Base.TC_CLIENT_CONNECT_REQUEST
    if not base.HasField("tcClientConnectRequest"):
        raise no_body(code, "tcClientConnectRequest")
    m = base.tcClientConnectRequest
    request_id = checked_request_id(m, code)
    if not m.HasField("tc_id"):
        raise missing(code, "tc_id", request_id)
    return TcClientConnect(request_id, m.tc_id, m.scalable)


def _decode_tc_client_connect_response(base: pb.BaseCommand) -> Command:
    code = _Base.TC_CLIENT_CONNECT_RESPONSE
    if not base.HasField("tcClientConnectResponse"):
        raise no_body(code, "tcClientConnectResponse")
    m = base.tcClientConnectResponse
    request_id = checked_request_id(m, code)
    return TcClientConnectResponse(request_id, server_error(m, "error", 2), opt_text(m, "message"))


def _encode_partitioned_metadata(c: PartitionedMetadata) -> pb.BaseCommand:
    base = _Base(type=_Base.PARTITIONED_METADATA)
    m = base.partitionMetadata
    m.topic = c.topic
    m.request_id = wire_request_id(c.request_id)
    if not c.metadata_auto_creation_enabled:  # the wire default is true
        m.metadata_auto_creation_enabled = False
    return base


def _encode_partitioned_metadata_response(c: PartitionedMetadataResponse) -> pb.BaseCommand:
    base = _Base(type=_Base.PARTITIONED_METADATA_RESPONSE)
    m = base.partitionMetadataResponse
    m.request_id = wire_request_id(c.request_id)
    m.partitions = c.partitions
    if c.error is None:
        m.response = _PM_SUCCESS  # type: ignore[assignment]
        if c.message is not None:
            m.message = c.message
    else:
        m.response = _PM_FAILED  # type: ignore[assignment]
        m.error = c.error  # type: ignore[assignment]
        m.message = error_message(c.error, c.message)
    return base


def _encode_lookup(c: Lookup) -> pb.BaseCommand:
    base = _Base(type=_Base.LOOKUP)
    m = base.lookupTopic
    m.topic = c.topic
    m.request_id = wire_request_id(c.request_id)
    m.authoritative = c.authoritative
    if c.advertised_listener_name is not None:
        m.advertised_listener_name = c.advertised_listener_name
    for key, value in c.properties:
        m.properties.add(key=key, value=value)
    return base


def _encode_lookup_response(c: LookupResponse) -> pb.BaseCommand:
    base = _Base(type=_Base.LOOKUP_RESPONSE)
    m = base.lookupTopicResponse
    if c.broker_service_url is not None:
        m.brokerServiceUrl = c.broker_service_url
    if c.broker_service_url_tls is not None:
        m.brokerServiceUrlTls = c.broker_service_url_tls
    m.response = c.response  # type: ignore[assignment]
    m.request_id = wire_request_id(c.request_id)
    m.authoritative = c.authoritative
    if c.error is not None:
        m.error = c.error  # type: ignore[assignment]
        m.message = error_message(c.error, c.message)
    elif c.message is not None:
        m.message = c.message
    if c.proxy_through_service_url:
        m.proxy_through_service_url = True
    return base


def _encode_watch(c: WatchTcAssignments) -> pb.BaseCommand:
    base = _Base(type=_Base.WATCH_TC_ASSIGNMENTS)
    base.watchTcAssignments.watch_id = c.watch_id
    return base


def _encode_watch_update(c: WatchTcAssignmentsUpdate) -> pb.BaseCommand:
    base = _Base(type=_Base.WATCH_TC_ASSIGNMENTS_UPDATE)
    m = base.watchTcAssignmentsUpdate
    m.watch_id = c.watch_id
    if c.snapshot is not None:
        s = m.snapshot
        s.parallelism = c.snapshot.parallelism
        for a in c.snapshot.assignments:
            target = s.assignments.add()
            target.tc_id = a.tc_id
            if a.broker_service_url is not None:
                target.broker_service_url = a.broker_service_url
            if a.broker_service_url_tls is not None:
                target.broker_service_url_tls = a.broker_service_url_tls
    if c.error is not None:
        m.error = c.error  # type: ignore[assignment]
        m.message = error_message(c.error, c.message)
    elif c.message is not None:
        m.message = c.message
    return base


def _encode_watch_close(c: WatchTcAssignmentsClose) -> pb.BaseCommand:
    base = _Base(type=_Base.WATCH_TC_ASSIGNMENTS_CLOSE)
    base.watchTcAssignmentsClose.watch_id = c.watch_id
    return base


def _encode_tc_client_connect(c: TcClientConnect) -> pb.BaseCommand:
    base = _Base(type=_Base.TC_CLIENT_CONNECT_REQUEST)
    m = base.tcClientConnectRequest
    m.request_id = wire_request_id(c.request_id)
    m.tc_id = c.tc_id
    if c.scalable:
        m.scalable = True
    return base


def _encode_tc_client_connect_response(c: TcClientConnectResponse) -> pb.BaseCommand:
    base = _Base(type=_Base.TC_CLIENT_CONNECT_RESPONSE)
    m = base.tcClientConnectResponse
    m.request_id = wire_request_id(c.request_id)
    if c.error is not None:
        m.error = c.error  # type: ignore[assignment]
        m.message = error_message(c.error, c.message)
    elif c.message is not None:
        m.message = c.message
    return base


register(PartitionedMetadata, _Base.PARTITIONED_METADATA,
         decode=_decode_partitioned_metadata, encode=_encode_partitioned_metadata)
register(PartitionedMetadataResponse, _Base.PARTITIONED_METADATA_RESPONSE,
         decode=_decode_partitioned_metadata_response, encode=_encode_partitioned_metadata_response)
register(Lookup, _Base.LOOKUP, decode=_decode_lookup, encode=_encode_lookup)
register(LookupResponse, _Base.LOOKUP_RESPONSE, decode=_decode_lookup_response, encode=_encode_lookup_response)
register(TcClientConnect, _Base.TC_CLIENT_CONNECT_REQUEST,
         decode=_decode_tc_client_connect, encode=_encode_tc_client_connect)
register(TcClientConnectResponse, _Base.TC_CLIENT_CONNECT_RESPONSE,
         decode=_decode_tc_client_connect_response, encode=_encode_tc_client_connect_response)
register(WatchTcAssignments, _Base.WATCH_TC_ASSIGNMENTS, decode=_decode_watch, encode=_encode_watch)
register(WatchTcAssignmentsUpdate, _Base.WATCH_TC_ASSIGNMENTS_UPDATE,
         decode=_decode_watch_update, encode=_encode_watch_update)
register(WatchTcAssignmentsClose, _Base.WATCH_TC_ASSIGNMENTS_CLOSE,
         decode=_decode_watch_close, encode=_encode_watch_close)
