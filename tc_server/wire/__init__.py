"""Sans-IO Pulsar wire codec: frames, typed commands, ServerError codes. No asyncio, no sockets.

Typical use by a connection::

    decoder = FrameDecoder(max_frame_size)
    decoder.feed(data)
    while (frame := decoder.next_frame()) is not None:   # FrameError: close the connection
        command = decode_command(frame)                   # MalformedCommand: ERROR, then close
        ...
        transport.write(encode_command(response))
"""

from tc_server.wire.codec import command_name, decode_command, encode_command
from tc_server.wire.commands import (
    AddPartitionToTxn,
    AddPartitionToTxnResponse,
    AddSubscriptionToTxn,
    AddSubscriptionToTxnResponse,
    AuthChallenge,
    AuthResponse,
    Command,
    Connect,
    Connected,
    EndTxn,
    EndTxnResponse,
    Error,
    FeatureFlags,
    Lookup,
    LookupResponse,
    LookupType,
    NewTxn,
    NewTxnResponse,
    PartitionedMetadata,
    PartitionedMetadataResponse,
    Ping,
    Pong,
    Subscription,
    TcAssignment,
    TcAssignmentsSnapshot,
    TcClientConnect,
    TcClientConnectResponse,
    TxnAction,
    Unknown,
    WatchTcAssignments,
    WatchTcAssignmentsClose,
    WatchTcAssignmentsUpdate,
)
from tc_server.wire.errors import FrameError, MalformedCommand, ServerError, WireError
from tc_server.wire.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    MESSAGE_SIZE_FRAME_PADDING,
    FrameDecoder,
    encode_frame,
)

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "MESSAGE_SIZE_FRAME_PADDING",
    "AddPartitionToTxn",
    "AddPartitionToTxnResponse",
    "AddSubscriptionToTxn",
    "AddSubscriptionToTxnResponse",
    "AuthChallenge",
    "AuthResponse",
    "Command",
    "Connect",
    "Connected",
    "EndTxn",
    "EndTxnResponse",
    "Error",
    "FeatureFlags",
    "FrameDecoder",
    "FrameError",
    "Lookup",
    "LookupResponse",
    "LookupType",
    "MalformedCommand",
    "NewTxn",
    "NewTxnResponse",
    "PartitionedMetadata",
    "PartitionedMetadataResponse",
    "Ping",
    "Pong",
    "ServerError",
    "Subscription",
    "TcAssignment",
    "TcAssignmentsSnapshot",
    "TcClientConnect",
    "TcClientConnectResponse",
    "TxnAction",
    "Unknown",
    "WatchTcAssignments",
    "WatchTcAssignmentsClose",
    "WatchTcAssignmentsUpdate",
    "WireError",
    "command_name",
    "decode_command",
    "encode_command",
    "encode_frame",
]
