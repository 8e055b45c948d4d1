"""Run the stand-in Oxia server as its own process, for tests whose own thread blocks (the interop
tests wait on a JVM): ``python -m tests.oxia_standin --shards 3``. Prints ``listening HOST:PORT``
once it serves, and serves until SIGTERM. It is the stand-in, not Oxia: see server.py."""

from __future__ import annotations

import argparse
import asyncio
import signal

from tests.oxia_standin.server import StandinOxia


async def serve(shards: int) -> None:
    oxia = StandinOxia(shards)
    await oxia.start()
    print(f"listening {oxia.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await oxia.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.oxia_standin")
    parser.add_argument("--shards", type=int, default=3)
    asyncio.run(serve(parser.parse_args().shards))


if __name__ == "__main__":
    main()
