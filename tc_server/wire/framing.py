"""Splitting a byte stream into Pulsar frames and wrapping a command into one. No I/O here.

A simple command is ``[totalSize:u32 BE][cmdSize:u32 BE][BaseCommand]`` with
``totalSize = 4 + cmdSize``; a payload command (SEND / MESSAGE) has message metadata and payload
after the command, inside ``totalSize`` (docs/pulsar-protocol.md §1, from Pulsar's ``Commands.java``).
"""

from __future__ import annotations

import struct
from typing import Final

from tc_server.wire.errors import FrameError

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_MAX_FRAME_SIZE",
    "MESSAGE_SIZE_FRAME_PADDING",
    "FrameDecoder",
    "encode_frame",
]

# Pulsar's default maxMessageSize (Commands.DEFAULT_MAX_MESSAGE_SIZE, 5 MiB); CONNECTED advertises it.
DEFAULT_MAX_MESSAGE_SIZE: Final = 5 * 1024 * 1024
# Room for the command and metadata around a maximum-size payload (Commands.MESSAGE_SIZE_FRAME_PADDING).
MESSAGE_SIZE_FRAME_PADDING: Final = 10 * 1024
# The broker's frame limit: maxMessageSize + padding = 5253120 bytes, the 4-byte size field included
# (so totalSize is at most 5253116; docs/pulsar-protocol.md §1).
DEFAULT_MAX_FRAME_SIZE: Final = DEFAULT_MAX_MESSAGE_SIZE + MESSAGE_SIZE_FRAME_PADDING

_HEADER: Final = struct.Struct(">II")  # totalSize, cmdSize
_U32: Final = struct.Struct(">I")
_SIZE_FIELD: Final = 4  # the totalSize field itself: not counted in totalSize, counted against the limit

# Consumed bytes are dropped from the front of the buffer only once this many have piled up (or the
# buffer runs empty), so a burst of small frames costs one copy, not one per frame.
_COMPACT_AT: Final = 64 * 1024


class FrameDecoder:
    """Turns a byte stream, fed in chunks of any size, into the BaseCommand bytes of each frame.

    ``max_frame_size`` bounds the whole frame, its own 4-byte size field included, as a broker's
    ``LengthFieldBasedFrameDecoder(max, 0, 4, 0, 4)`` does: Netty's frame length is the field's value
    plus the field's end offset (4), so ``totalSize`` may be at most ``max_frame_size - 4``. It is a
    public attribute because a peer may replace its limit after the handshake, as the Java client does
    with CONNECTED's ``max_message_size`` (``FrameDecoderUtil.replaceFrameDecoder``).
    """

    __slots__ = ("_buf", "_pos", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 1:
            raise ValueError(f"max_frame_size must be positive, got {max_frame_size}")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._pos = 0  # start of the first unconsumed byte in _buf

    @property
    def buffered(self) -> int:
        """How many received bytes are not yet returned as (or skipped with) a frame."""
        return len(self._buf) - self._pos

    def take_buffered(self) -> bytes:
        """Hand back (and forget) every received byte not yet returned as a frame: a connection that
        turns into a byte relay (tc-server carrying a proxied client to its broker) passes them on."""
        rest = bytes(self._buf[self._pos:])
        self._buf.clear()
        self._pos = 0
        return rest

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes; call :meth:`next_frame` until it returns ``None`` afterwards."""
        self._buf += data

    def next_frame(self) -> bytes | None:
        """Return the BaseCommand bytes of the next complete frame, or ``None`` if more data is needed.

        The payload of a payload command (bytes after the command inside ``totalSize``) is dropped:
        a transaction coordinator serves no SEND or MESSAGE, and the command alone is enough to refuse
        it. Sizes are checked as soon as their bytes are in, before the body arrives, so a peer cannot
        make us buffer a frame we will reject anyway.

        Raises:
            FrameError: the frame exceeds ``max_frame_size`` or is too small to hold a command,
                ``cmdSize`` is 0, or ``cmdSize`` does not fit in ``totalSize``. The stream cannot be
                resynchronized after this; close the connection. The decoder stays failed: later calls
                raise again.
        """
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail >= _HEADER.size:
            total, cmd_size = _HEADER.unpack_from(buf, pos)
        elif avail >= _SIZE_FIELD:
            total, cmd_size = _U32.unpack_from(buf, pos)[0], None
        else:
            return None
        if total > self.max_frame_size - _SIZE_FIELD:
            raise FrameError(f"frame of {total + _SIZE_FIELD} bytes (totalSize {total}) exceeds the limit of "
                             f"{self.max_frame_size}")
        if total <= 4:
            # Not even room for cmdSize and one command byte: reject now rather than read the next
            # frame's bytes as this one's cmdSize.
            raise FrameError(f"frame of {total} bytes cannot hold a command")
        if cmd_size is None:
            return None
        if cmd_size == 0:
            raise FrameError("frame with an empty command (cmdSize 0)")
        if cmd_size > total - 4:
            raise FrameError(f"command size {cmd_size} does not fit in a frame of {total} bytes")
        end = pos + _SIZE_FIELD + total
        if len(buf) < end:
            return None
        start = pos + _HEADER.size
        command = bytes(buf[start : start + cmd_size])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        elif end >= _COMPACT_AT:
            del buf[:end]
            self._pos = 0
        else:
            self._pos = end
        return command


def encode_frame(command_bytes: bytes) -> bytes:
    """Wrap serialized BaseCommand bytes into a simple-command frame, size prefixes included."""
    size = len(command_bytes)
    return _HEADER.pack(size + 4, size) + command_bytes
