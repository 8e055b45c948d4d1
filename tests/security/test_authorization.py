"""Authorization on the Pulsar port: the authenticated role owns the transactions it opens. Another
role that is not a superuser gets TransactionNotFound for END_TXN, ADD_PARTITION and ADD_SUBSCRIPTION
on them (as the broker answers: it does not reveal that the txn exists); a superuser may act on any."""

from __future__ import annotations

from tc_server.client import connect
from tc_server.coordinator import layout
from tc_server.wire import ServerError
from tests.security.pki import data_url, make_token
from tests.security.support import token_auth

TOPIC = "persistent://public/default/orders-partition-0"


async def clients(app, secret: bytes, *roles: str):
    return [await connect("127.0.0.1", app.listener.port, auth=token_auth(make_token(secret, "HS256", role)))
            for role in roles]


async def test_another_role_cannot_end_or_add_to_the_txn(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret), superuser_roles="admin")
    alice, bob = await clients(app, secret, "alice", "bob")
    try:
        txn = await alice.new_txn(tc_id=2, ttl_ms=60_000)
        for answer in (await bob.add_partition(txn.most, txn.least, TOPIC),
                       await bob.add_subscription(txn.most, txn.least, TOPIC, "audit"),
                       await bob.end_txn(txn.most, txn.least, commit=True),
                       await bob.end_txn(txn.most, txn.least, commit=False)):
            assert answer.error is ServerError.TransactionNotFound, answer
            assert answer.most == txn.most  # the Java client routes the answer by it
            # The words of an id that does not exist: nothing tells bob that alice's txn exists.
            assert answer.message == f"transaction ({txn.most},{txn.least}) not found"
        missing = await bob.end_txn(txn.most, txn.least + 1000, commit=False)
        assert (missing.error, missing.message) == (ServerError.TransactionNotFound,
                                                    f"transaction ({txn.most},{txn.least + 1000}) not found")
        # Bob's attempts changed nothing: the owner still adds to it and commits it.
        assert (await alice.add_partition(txn.most, txn.least, TOPIC)).error is None
        assert (await alice.add_subscription(txn.most, txn.least, TOPIC, "audit")).error is None
        assert (await alice.end_txn(txn.most, txn.least, commit=True)).error is None
    finally:
        alice.close()
        bob.close()


async def test_a_superuser_may_add_to_and_end_any_txn(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      superuser_roles="ops, admin")
    alice, admin = await clients(app, secret, "alice", "admin")
    try:
        committed = await alice.new_txn(tc_id=0, ttl_ms=60_000)
        assert (await admin.add_partition(committed.most, committed.least, TOPIC)).error is None
        assert (await admin.add_subscription(committed.most, committed.least, TOPIC, "s")).error is None
        assert (await admin.end_txn(committed.most, committed.least, commit=True)).error is None
        aborted = await alice.new_txn(tc_id=0, ttl_ms=60_000)
        assert (await admin.end_txn(aborted.most, aborted.least, commit=False)).error is None
        # The owner sees the superuser's decision: a retried abort succeeds, a commit does not.
        assert (await alice.end_txn(aborted.most, aborted.least, commit=False)).error is None
        assert (await alice.end_txn(aborted.most, aborted.least, commit=True)).error is ServerError.TransactionNotFound
    finally:
        alice.close()
        admin.close()


async def test_the_role_claim_not_sub_decides_who_is_superuser(start, secret):
    """With --token-auth-claim the superuser check reads that claim, never ``sub``."""
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      token_auth_claim="role", superuser_roles="tc-admin")
    alice = await connect("127.0.0.1", app.listener.port,
                          auth=token_auth(make_token(secret, "HS256", "tc-admin", role="alice")))
    admin = await connect("127.0.0.1", app.listener.port,
                          auth=token_auth(make_token(secret, "HS256", "alice", role="tc-admin")))
    try:
        txn = await alice.new_txn(tc_id=1)
        assert (await admin.end_txn(txn.most, txn.least, commit=True)).error is None
        other = await admin.new_txn(tc_id=1)
        # The sub claim says tc-admin, but the role is the configured claim's: alice is no superuser.
        assert (await alice.end_txn(other.most, other.least, commit=True)).error is ServerError.TransactionNotFound
    finally:
        alice.close()
        admin.close()




async def test_an_unreadable_header_is_not_found_to_a_role_and_unreadable_to_a_superuser(start, secret):
    # Its owner cannot be read: bob was answered MetadataError "header of (1,N) is unreadable", where an id that
    # does not exist is TransactionNotFound, and so learnt that the id exists (a review).
    app = await start(authentication_providers="token", token_secret_key=data_url(secret), superuser_roles="admin")
    bob, admin = await clients(app, secret, "bob", "admin")
    most, damaged = 1, 10_000
    await app.coordinator.store.put(layout.header_path(most, damaged), b"{not json",
                                    partition_key=layout.txn_key(most, damaged))
    try:
        for least in (damaged, damaged + 1):
            answer = await bob.end_txn(most, least, commit=False)
            assert (answer.error, answer.message) == (ServerError.TransactionNotFound,
                                                      f"transaction ({most},{least}) not found"), answer
        answer = await admin.end_txn(most, damaged, commit=False)
        assert (answer.error, answer.message) == (ServerError.MetadataError,
                                                  f"header of ({most},{damaged}) is unreadable"), answer
    finally:
        bob.close()
        admin.close()
