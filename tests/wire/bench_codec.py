"""Micro-benchmark of the codec's hot path: ``.venv/bin/python tests/wire/bench_codec.py``.

Measures, per operation, what the server does for each NEW_TXN / END_TXN: decode the command bytes
and encode the typed response into a frame, plus the frame decoder on a pipelined burst.
"""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable

from tc_server.wire import (
    EndTxn,
    EndTxnResponse,
    FrameDecoder,
    NewTxn,
    NewTxnResponse,
    ServerError,
    TxnAction,
    decode_command,
    encode_command,
)

NEW_TXN = encode_command(NewTxn(123456, 60000, 7))[8:]
END_TXN = encode_command(EndTxn(123457, 7, 987654, TxnAction.COMMIT))[8:]


def per_op_us(fn: Callable[[], object], number: int = 200_000) -> float:
    # CPU time, not wall time: the numbers should not depend on what else the machine is running.
    return min(timeit.repeat(fn, number=number, repeat=5, timer=time.process_time)) / number * 1e6


def new_txn_round() -> bytes:
    cmd = decode_command(NEW_TXN)
    assert isinstance(cmd, NewTxn)
    return encode_command(NewTxnResponse(cmd.request_id, cmd.tc_id, 987654))


def end_txn_round() -> bytes:
    cmd = decode_command(END_TXN)
    assert isinstance(cmd, EndTxn)
    return encode_command(EndTxnResponse(cmd.request_id, cmd.most, cmd.least))


def error_response() -> bytes:
    return encode_command(NewTxnResponse(1, 7, error=ServerError.TransactionNotFound, message="gone"))


BURST = encode_command(NewTxn(1, 60000, 7)) * 1000


def frame_burst() -> int:
    decoder = FrameDecoder(1 << 20)
    decoder.feed(BURST)
    n = 0
    while decoder.next_frame() is not None:
        n += 1
    return n


def main() -> None:
    print(f"decode NEW_TXN                    {per_op_us(lambda: decode_command(NEW_TXN)):6.2f} us")
    response = NewTxnResponse(1, 7, 9)
    print(f"encode NEW_TXN_RESPONSE           {per_op_us(lambda: encode_command(response)):6.2f} us")
    print(f"NEW_TXN decode + response encode  {per_op_us(new_txn_round):6.2f} us")
    print(f"END_TXN decode + response encode  {per_op_us(end_txn_round):6.2f} us")
    print(f"encode error NEW_TXN_RESPONSE     {per_op_us(error_response):6.2f} us")
    print(f"FrameDecoder, per frame (burst)   {per_op_us(frame_burst, number=200) / 1000:6.2f} us")


if __name__ == "__main__":
    main()
