"""Admin listings that grow with the open or undelivered txns answer one page (issue 15: slowTransactions
with 200,000 open built a 37 MB answer): ``?limit=`` (default 1000) entries in txn id order after
``?after=(most,least)``, the next page named by the X-Next-After and Link headers, the body in the shape
Pulsar's admin returns. Thousands of open txns on the memory store, read over the real admin socket."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest

from tc_server.admin.routes import DEFAULT_PAGE, MAX_PAGE
from tc_server.app import App
from tc_server.coordinator.layout import Participant

OPEN = 2500  # more than two default pages
SLOW = "/admin/v3/transactions/slowTransactions/0"
UNDELIVERED = "/admin/v3/transactions/undelivered"


def fetch(app: App, path: str) -> tuple[int, Any, dict[str, str]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{app.admin.port}{path}", timeout=30) as response:  # noqa: S310
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


async def get(app: App, path: str) -> tuple[int, Any, dict[str, str]]:
    return await asyncio.to_thread(fetch, app, path)


async def open_txns(app: App, count: int) -> set[str]:
    """``count`` open txns spread over the coordinators, created in process (fast); their ids."""
    partitions = app.coordinator.led_partitions()
    opened = set()
    for i in range(count):
        partition = partitions[i % len(partitions)]
        opened.add(f"({partition.tc_id},{await partition.new_txn(3_600_000, None)})")
    return opened


async def all_pages(app: App, first: str) -> tuple[list[Any], list[int]]:
    """Follow the Link header from ``first``; the pages' bodies and their sizes."""
    bodies, sizes = [], []
    path: str | None = first
    while path is not None:
        status, body, headers = await get(app, path)
        assert status == 200, body
        bodies.append(body)
        sizes.append(len(body))
        link = headers.get("Link")
        path = link[1:link.index(">")] if link else None
        if path is not None:
            assert urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)["after"] == [headers["X-Next-After"]]
    return bodies, sizes


def txn_order(txn: str) -> tuple[int, int]:
    most, least = txn.strip("()").split(",")
    return int(most), int(least)


async def test_slow_transactions_answers_pages_that_cover_every_open_txn_once(app: App) -> None:
    opened = await open_txns(app, OPEN)
    status, first, headers = await get(app, SLOW)
    # The plain call: Pulsar's map of txn id -> TransactionMetadata, the first DEFAULT_PAGE of them.
    assert status == 200 and len(first) == DEFAULT_PAGE
    some = next(iter(first.values()))
    assert some["status"] == "OPEN" and some["timeoutAt"] == 3_600_000
    assert headers["X-Next-After"] == list(first)[-1]
    bodies, sizes = await all_pages(app, SLOW + "?limit=700")
    assert sizes == [700, 700, 700, 400]
    listed = [txn for body in bodies for txn in body]
    assert len(listed) == len(set(listed)) and set(listed) == opened
    assert listed == sorted(listed, key=txn_order)  # txn id order, page after page


async def test_slow_transactions_pages_keep_the_filters(app: App) -> None:
    opened = await open_txns(app, 300)
    bodies, sizes = await all_pages(app, SLOW + "?coordinatorId=3&limit=7")
    listed = {txn for body in bodies for txn in body}
    assert listed == {txn for txn in opened if txn.startswith("(3,")} and max(sizes) == 7
    status, above, headers = await get(app, "/admin/v3/transactions/slowTransactions/3600000")
    assert (status, above) == (200, {}) and "X-Next-After" not in headers  # nothing above: no next page


async def test_undelivered_answers_pages(app: App) -> None:
    # Decided txns whose participants were never told (no --upstream-url: the outbox keeps them),
    # between open txns that have participants too (not listed: nothing decided yet).
    decided = set()
    for i in range(1800):  # 1,200 decided: more than a default page
        partition = app.coordinator.partition(i % 4)
        least = await partition.new_txn(3_600_000, None)
        await partition.add_participants(least, None, [Participant(f"persistent://public/default/t{i}")])
        if i % 3:
            await partition.end_txn(least, commit=True, principal=None)
            decided.add(f"({partition.tc_id},{least})")
    status, first, headers = await get(app, UNDELIVERED)
    assert status == 200 and len(first) == DEFAULT_PAGE and headers["X-Next-After"] == first[-1]["txnId"]
    bodies, sizes = await all_pages(app, UNDELIVERED + "?limit=300")
    listed = [doc["txnId"] for body in bodies for doc in body]
    assert sizes[:2] == [300, 300] and len(listed) == len(set(listed)) and set(listed) == decided
    assert {doc["status"] for body in bodies for doc in body} == {"COMMITTED"}
    bodies, _ = await all_pages(app, UNDELIVERED + "?coordinatorId=2&limit=50")
    assert {doc["txnId"] for body in bodies for doc in body} == {t for t in decided if t.startswith("(2,")}


@pytest.mark.parametrize("query, parameter", [
    ("limit=0", "limit"), (f"limit={MAX_PAGE + 1}", "limit"), ("limit=-1", "limit"), ("limit=%C2%B2", "limit"),
    ("after=5", "after"), ("after=(1,x)", "after"), ("after=(1,2,3)", "after"), ("after=(-1,2)", "after"),
])
@pytest.mark.parametrize("path", [SLOW, UNDELIVERED])
async def test_a_bad_page_parameter_is_400_naming_it(app: App, path: str, query: str, parameter: str) -> None:
    status, doc, _ = await get(app, f"{path}?{query}")
    assert status == 400, doc
    assert str(doc["reason"]).startswith(f"{parameter}: "), doc


async def test_the_undelivered_listing_holds_memory_for_its_page_not_for_what_it_scans(app: App) -> None:
    # Every txn scanned kept an entry (its participants told), open ones included: 1.8 MB for a page of one over
    # 5,000 open txns with a participant each, 13.7 MB over 40,000 (a review). Their records are scanned all the
    # same (brokers record a txn's partitions while it is open); what is held is the page.
    partitions = app.coordinator.led_partitions()
    for n in range(5000):
        partition = partitions[n % len(partitions)]
        least = await partition.new_txn(3_600_000, None)
        await partition.add_participants(least, None, [Participant(f"persistent://public/default/t{n}")])
    tracemalloc.start()
    try:
        status, body, _ = await get(app, f"{UNDELIVERED}?limit=1")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (status, body) == (200, [])  # every one of them is still open
    assert peak < 1_000_000, peak  # 0.3 MB measured with the page alone held; 1.8 MB before
