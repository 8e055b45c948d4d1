"""Child process of test_embedded_store's kill -9 test: writes until killed.

Prints "ephemeral" once its ephemeral record is stored, then each key as soon as its put has been
acknowledged (the put's future resolved), one line each, flushed.
"""

from __future__ import annotations

import asyncio
import sys

from tc_server.store.embedded import EmbeddedStore

WORKERS = 8


async def main(data_dir: str) -> None:
    store = await EmbeddedStore.open(data_dir)
    await store.put("/k/ephemeral", b"", ephemeral=True)
    print("ephemeral", flush=True)

    async def worker(w: int) -> None:
        for i in range(1_000_000):
            key = f"/k/w{w}-{i:07d}"
            await store.put(key, b"v", expected_version=-1, secondary_indexes={"n": key})
            sys.stdout.write(key + "\n")
            sys.stdout.flush()

    await asyncio.gather(*(worker(w) for w in range(WORKERS)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
