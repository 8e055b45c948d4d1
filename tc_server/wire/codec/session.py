"""The connection's own commands: CONNECT / CONNECTED, AUTH_CHALLENGE / AUTH_RESPONSE, PING / PONG and
ERROR (docs/pulsar-protocol.md §1, §2)."""

from __future__ import annotations

from typing import Any, Final

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.wire.codec.registry import (
    checked_request_id,
    missing,
    no_body,
    opt_text,
    register,
    server_error,
    text,
    wire_request_id,
)
from tc_server.wire.commands import (
    AuthChallenge,
    AuthResponse,
    Command,
    Connect,
    Connected,
    Error,
    FeatureFlags,
    Ping,
    Pong,
)

_Base = pb.BaseCommand


def _feature_flags(msg: Any) -> FeatureFlags:
    return FeatureFlags(
        msg.supports_auth_refresh,
        msg.supports_broker_entry_metadata,
        msg.supports_partial_producer,
        msg.supports_topic_watchers,
        msg.supports_get_partitioned_metadata_without_auto_creation,
        msg.supports_repl_dedup_by_lid_and_eid,
        msg.supports_topic_watcher_reconcile,
        msg.supports_scalable_topics,
        msg.supports_tc_metadata_discovery,
    )


def _decode_connect(base: pb.BaseCommand) -> Command:
    if not base.HasField("connect"):
        raise no_body(_Base.CONNECT, "connect")
    m = base.connect
    if not m.HasField("client_version"):
        raise missing(_Base.CONNECT, "client_version")
    return Connect(
        client_version=text(m.client_version),
        protocol_version=m.protocol_version,
        auth_method_name=opt_text(m, "auth_method_name"),
        auth_data=m.auth_data if m.HasField("auth_data") else None,
        feature_flags=_feature_flags(m.feature_flags) if m.HasField("feature_flags") else None,
        proxy_to_broker_url=opt_text(m, "proxy_to_broker_url"),
        original_principal=opt_text(m, "original_principal"),
        original_auth_data=opt_text(m, "original_auth_data"),
        original_auth_method=opt_text(m, "original_auth_method"),
        proxy_version=opt_text(m, "proxy_version"),
    )


def _decode_connected(base: pb.BaseCommand) -> Command:
    if not base.HasField("connected"):
        raise no_body(_Base.CONNECTED, "connected")
    m = base.connected
    if not m.HasField("server_version"):
        raise missing(_Base.CONNECTED, "server_version")
    return Connected(
        server_version=text(m.server_version),
        protocol_version=m.protocol_version,
        max_message_size=m.max_message_size if m.HasField("max_message_size") else None,
        feature_flags=_feature_flags(m.feature_flags) if m.HasField("feature_flags") else None,
    )


def _decode_auth_challenge(base: pb.BaseCommand) -> Command:
    if not base.HasField("authChallenge"):
        raise no_body(_Base.AUTH_CHALLENGE, "authChallenge")
    m = base.authChallenge
    auth = m.challenge
    has_auth = m.HasField("challenge")
    return AuthChallenge(
        server_version=text(m.server_version),
        challenge_method=opt_text(auth, "auth_method_name") if has_auth else None,
        challenge_data=auth.auth_data if has_auth and auth.HasField("auth_data") else None,
        protocol_version=m.protocol_version,
    )


def _decode_auth_response(base: pb.BaseCommand) -> Command:
    if not base.HasField("authResponse"):
        raise no_body(_Base.AUTH_RESPONSE, "authResponse")
    m = base.authResponse
    auth = m.response
    has_auth = m.HasField("response")
    return AuthResponse(
        client_version=text(m.client_version),
        response_method=opt_text(auth, "auth_method_name") if has_auth else None,
        response_data=auth.auth_data if has_auth and auth.HasField("auth_data") else None,
        protocol_version=m.protocol_version,
    )


# PING and PONG have empty messages; Java sends them, but their absence changes nothing.
_PING: Final = Ping()
_PONG: Final = Pong()


def _decode_error(base: pb.BaseCommand) -> Command:
    if not base.HasField("error"):
        raise no_body(_Base.ERROR, "error")
    m = base.error
    request_id = checked_request_id(m, _Base.ERROR)
    error = server_error(m, "error", 2)
    if error is None:
        raise missing(_Base.ERROR, "error", request_id)
    return Error(request_id, error, text(m.message))


def _set_feature_flags(target: pb.FeatureFlags, flags: FeatureFlags) -> None:
    target.SetInParent()
    # Only the true flags go on the wire, as the broker does; absent means false.
    if flags.supports_auth_refresh:
        target.supports_auth_refresh = True
    if flags.supports_broker_entry_metadata:
        target.supports_broker_entry_metadata = True
    if flags.supports_partial_producer:
        target.supports_partial_producer = True
    if flags.supports_topic_watchers:
        target.supports_topic_watchers = True
    if flags.supports_get_partitioned_metadata_without_auto_creation:
        target.supports_get_partitioned_metadata_without_auto_creation = True
    if flags.supports_repl_dedup_by_lid_and_eid:
        target.supports_repl_dedup_by_lid_and_eid = True
    if flags.supports_topic_watcher_reconcile:
        target.supports_topic_watcher_reconcile = True
    if flags.supports_scalable_topics:
        target.supports_scalable_topics = True
    if flags.supports_tc_metadata_discovery:
        target.supports_tc_metadata_discovery = True


def _set_auth_data(target: pb.AuthData, method: str | None, data: bytes | None) -> None:
    if method is None and data is None:
        return
    target.SetInParent()
    if method is not None:
        target.auth_method_name = method
    if data is not None:
        target.auth_data = data


def _encode_connect(c: Connect) -> pb.BaseCommand:
    base = _Base(type=_Base.CONNECT)
    m = base.connect
    m.client_version = c.client_version
    m.protocol_version = c.protocol_version
    if c.auth_method_name is not None:
        m.auth_method_name = c.auth_method_name
    if c.auth_data is not None:
        m.auth_data = c.auth_data
    if c.feature_flags is not None:
        _set_feature_flags(m.feature_flags, c.feature_flags)
    if c.proxy_to_broker_url is not None:
        m.proxy_to_broker_url = c.proxy_to_broker_url
    if c.original_principal is not None:
        m.original_principal = c.original_principal
    if c.original_auth_data is not None:
        m.original_auth_data = c.original_auth_data
    if c.original_auth_method is not None:
        m.original_auth_method = c.original_auth_method
    if c.proxy_version is not None:
        m.proxy_version = c.proxy_version
    return base


def _encode_connected(c: Connected) -> pb.BaseCommand:
    base = _Base(type=_Base.CONNECTED)
    m = base.connected
    m.server_version = c.server_version
    m.protocol_version = c.protocol_version
    if c.max_message_size is not None:
        m.max_message_size = c.max_message_size
    if c.feature_flags is not None:
        _set_feature_flags(m.feature_flags, c.feature_flags)
    return base


def _encode_auth_challenge(c: AuthChallenge) -> pb.BaseCommand:
    base = _Base(type=_Base.AUTH_CHALLENGE)
    m = base.authChallenge
    m.server_version = c.server_version
    _set_auth_data(m.challenge, c.challenge_method, c.challenge_data)
    m.protocol_version = c.protocol_version
    return base


def _encode_auth_response(c: AuthResponse) -> pb.BaseCommand:
    base = _Base(type=_Base.AUTH_RESPONSE)
    m = base.authResponse
    m.client_version = c.client_version
    _set_auth_data(m.response, c.response_method, c.response_data)
    m.protocol_version = c.protocol_version
    return base


def _encode_ping(c: Ping) -> pb.BaseCommand:
    base = _Base(type=_Base.PING)
    base.ping.SetInParent()
    return base


def _encode_pong(c: Pong) -> pb.BaseCommand:
    base = _Base(type=_Base.PONG)
    base.pong.SetInParent()
    return base


def _encode_error(c: Error) -> pb.BaseCommand:
    base = _Base(type=_Base.ERROR)
    m = base.error
    m.request_id = wire_request_id(c.request_id)
    m.error = c.error  # type: ignore[assignment]
    m.message = c.message
    return base


def _decode_ping(base: pb.BaseCommand) -> Command:
    return _PING


def _decode_pong(base: pb.BaseCommand) -> Command:
    return _PONG


register(Connect, _Base.CONNECT, decode=_decode_connect, encode=_encode_connect)
register(Connected, _Base.CONNECTED, decode=_decode_connected, encode=_encode_connected)
register(AuthChallenge, _Base.AUTH_CHALLENGE, decode=_decode_auth_challenge, encode=_encode_auth_challenge)
register(AuthResponse, _Base.AUTH_RESPONSE, decode=_decode_auth_response, encode=_encode_auth_response)
register(Ping, _Base.PING, decode=_decode_ping, encode=_encode_ping)
register(Pong, _Base.PONG, decode=_decode_pong, encode=_encode_pong)
register(Error, _Base.ERROR, decode=_decode_error, encode=_encode_error)
