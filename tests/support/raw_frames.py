"""Reading a server's frames off a raw socket, for tests that speak to it without a client library."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from tc_server.wire import Command, FrameDecoder, decode_command


async def read_commands(reader: asyncio.StreamReader, seconds: float,
                        until: Callable[[list[Command]], bool] | None = None) -> tuple[list[Command], bool]:
    """The commands the server sent within ``seconds`` (or until ``until(commands so far)`` holds), and
    whether it closed the connection meanwhile (EOF, or a reset)."""
    decoder = FrameDecoder(5 * 1024 * 1024)
    commands: list[Command] = []
    try:
        async with asyncio.timeout(seconds):
            while data := await reader.read(65536):
                decoder.feed(data)
                while (frame := decoder.next_frame()) is not None:
                    commands.append(decode_command(frame))
                if until is not None and until(commands):
                    return commands, False
            return commands, True
    except TimeoutError:
        return commands, False
    except (ConnectionResetError, ssl.SSLError):
        return commands, True
