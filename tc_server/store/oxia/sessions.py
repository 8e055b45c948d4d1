"""Per-shard client sessions for ephemeral records (docs/oxia-client.md, ``CreateSession``/``KeepAlive``).

An ephemeral put carries the session id of its shard; the session is created on the first such
put, kept alive every ``timeout / 10`` (the Go client's period, docs/oxia-client.md) and closed by
:meth:`SessionManager.close`, which makes the server delete the session's records. A session the
server no longer knows (it expired while this process was stalled or partitioned) is forgotten, so
the next ephemeral put starts a new one; its records are gone, which is what "ephemeral" promises.
Only that answer forgets a session (:func:`session_not_found`); any other failed heartbeat is retried.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import structlog

from tc_server._proto import oxia_client_pb2 as pb
from tc_server.store.api import StoreClosedError, StoreError, StoreUnavailableError, lease_clock
from tc_server.store.oxia.connections import ConnectionPool
from tc_server.store.oxia.reads import closed_under_the_call, cut_by_close, unavailable

log = structlog.get_logger(__name__)

# Oxia refuses session timeouts outside [2 s, 5 min] (common/constant/constants.go, docs/oxia-client.md).
MIN_SESSION_TIMEOUT_MS = 2_000
MAX_SESSION_TIMEOUT_MS = 300_000

# The share of the session timeout a heartbeat is trusted for (see _Session.alive_until): the server counts
# the timeout from when it handled the heartbeat, after it was sent; this leaves room for the two clocks'
# rates to differ.
LEASE_SHARE = 0.9

LeaderOf = Callable[[int], str]


@dataclass(slots=True)
class _Session:
    shard: int
    session_id: int
    # lease_clock() until which the server surely still has the session: the send time of the last
    # answered CreateSession or KeepAlive, plus LEASE_SHARE of the timeout.
    alive_until: float
    keepalive: asyncio.Task[None] | None = None


def session_not_found(error: grpc.aio.AioRpcError) -> bool:
    """Whether the server answered that it no longer has the session: ``NOT_FOUND`` from v0.17 (and
    the stand-in); up to v0.16 the custom code 108 "oxia: session not found", which grpc-python
    reports as ``UNKNOWN`` with the message kept (it maps every code above 16 to ``UNKNOWN``).

    Oxia's other custom codes (106 node is not leader, 104 already closed, 102 invalid status, ...)
    arrive as ``UNKNOWN`` too, during a leader move, for a session that lives on; the Go client
    retries every error but session-not-found (``oxia/sessions.go``).
    """
    code = error.code()
    return code is grpc.StatusCode.NOT_FOUND or (
        code is grpc.StatusCode.UNKNOWN and "session not found" in (error.details() or ""))


def default_client_identity() -> str:
    """Recorded by Oxia on ephemeral records, to tell which process holds them."""
    return f"tc-server@{socket.gethostname()}:{os.getpid()}"


class SessionManager:
    """Sessions of one store, one per shard that holds ephemeral records.

    ``leader_of(shard)`` gives the shard's current leader; it is asked on every call, so keepalives
    follow a leader change (sessions are replicated state in Oxia, not tied to a connection).
    """

    def __init__(
        self,
        pool: ConnectionPool,
        leader_of: LeaderOf,
        *,
        session_timeout_ms: int,
        request_timeout_s: float,
        client_identity: str,
    ) -> None:
        if not MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
            raise ValueError(
                f"session_timeout_ms must be within [{MIN_SESSION_TIMEOUT_MS}, {MAX_SESSION_TIMEOUT_MS}]")
        self._pool = pool
        self._leader_of = leader_of
        self._timeout_ms = session_timeout_ms
        self._request_timeout = request_timeout_s
        self.client_identity = client_identity
        self._lease_s = session_timeout_ms / 1000 * LEASE_SHARE
        self._sessions: dict[int, _Session] = {}
        self._creating: dict[int, asyncio.Lock] = {}
        self._closed = False  # close() began: no session is kept, none created

    def current(self, shard: int) -> int | None:
        """The id of this store's session on ``shard``, if it has one."""
        session = self._sessions.get(shard)
        return None if session is None else session.session_id

    def alive_until(self, shard: int, session_id: int | None) -> float:
        """``lease_clock()`` until which the server surely still has session ``session_id`` of
        ``shard``; 0.0 once it is not this store's session there any more (expired, closed, replaced)."""
        session = self._sessions.get(shard)
        return session.alive_until if session is not None and session.session_id == session_id else 0.0

    async def session_for(self, shard: int) -> int:
        """The session id to put ephemeral records on ``shard`` with, creating the session first if
        needed. Raises :class:`StoreUnavailableError` if it cannot be created in time."""
        session = self._sessions.get(shard)
        if session is not None:
            return session.session_id
        lock = self._creating.setdefault(shard, asyncio.Lock())
        async with lock:
            session = self._sessions.get(shard)
            if session is not None:
                return session.session_id
            if self._closed:
                raise StoreClosedError("the Oxia store is closed")
            request = pb.CreateSessionRequest(
                shard=shard, session_timeout_ms=self._timeout_ms, client_identity=self.client_identity)
            sent = lease_clock()
            try:
                async with asyncio.timeout(self._request_timeout):
                    response = await self._pool.stub(self._leader_of(shard)).CreateSession(request)
            except (grpc.RpcError, TimeoutError) as e:
                raise unavailable(f"create session on shard {shard}", e) from e
            except asyncio.CancelledError:
                closed_under_the_call()
                raise
            session = _Session(shard, response.session_id, sent + self._lease_s)
            if self._closed:
                # Created while close() ran, after it had closed the sessions it knew: close this one too
                # (best effort, as close() does), rather than leave it and its keep-alive running on.
                await self._close_one(session, self._request_timeout)
                raise StoreClosedError("the Oxia store is closed")
            session.keepalive = asyncio.get_running_loop().create_task(
                self._keep_alive(session), name=f"oxia-session-{shard}")
            self._sessions[shard] = session
            log.info("oxia_session_created", shard=shard, session_id=session.session_id)
            return session.session_id

    def forget(self, shard: int, session_id: int) -> None:
        """Drop a session the server reported as gone (``SESSION_DOES_NOT_EXIST``)."""
        session = self._sessions.get(shard)
        if session is not None and session.session_id == session_id:
            del self._sessions[shard]
            if session.keepalive is not None:
                session.keepalive.cancel()
            log.warning("oxia_session_lost", shard=shard, session_id=session_id)

    async def close(self, timeout_s: float) -> None:
        """Close every session (waiting up to ``timeout_s``); the server deletes their ephemeral records.
        Best effort: a session that cannot be closed expires by itself after the session timeout."""
        self._closed = True
        sessions = list(self._sessions.values())
        self._sessions.clear()
        for session in sessions:
            if session.keepalive is not None:
                session.keepalive.cancel()
        await asyncio.gather(*(self._close_one(s, timeout_s) for s in sessions))

    async def _close_one(self, session: _Session, timeout_s: float) -> None:
        request = pb.CloseSessionRequest(shard=session.shard, session_id=session.session_id)
        try:
            async with asyncio.timeout(timeout_s):
                await self._pool.stub(self._leader_of(session.shard)).CloseSession(request)
        except (grpc.RpcError, TimeoutError, StoreError) as e:
            log.warning("oxia_session_close_failed", shard=session.shard,
                        session_id=session.session_id, error=str(unavailable("close session", e)))
        except asyncio.CancelledError:
            # Best effort like the rest: close() may close the channels under this call (the close of a
            # session created while close() ran); that ended the caller's put with CancelledError.
            if not cut_by_close():
                raise
            log.warning("oxia_session_close_failed", shard=session.shard, session_id=session.session_id,
                        error="the store closed its connections during the call")

    async def _keep_alive(self, session: _Session) -> None:
        """A heartbeat every period, each on its own schedule rather than after the previous one's answer: a
        heartbeat waited for, its answer coming late (a slow path back, a busy server), spaced the next ones
        out, and given up at half the timeout it renewed nothing, so the lease lapsed for good on a session
        the server kept alive (it handled every heartbeat): no coordinator was served, here or anywhere."""
        period = self._timeout_ms / 10 / 1000
        heartbeat = pb.SessionHeartbeat(shard=session.shard, session_id=session.session_id)
        beats: set[asyncio.Task[None]] = set()
        try:
            while True:
                await asyncio.sleep(period)
                beat = asyncio.get_running_loop().create_task(self._beat(session, heartbeat))
                beats.add(beat)
                beat.add_done_callback(beats.discard)
        finally:
            for beat in beats:
                beat.cancel()

    async def _beat(self, session: _Session, heartbeat: pb.SessionHeartbeat) -> None:
        """One heartbeat. Its answer renews the lease from the send time (the server counts the timeout from
        when it handled it, which is later), so one that comes within the lease share renews it as safely as a
        prompt one; a later one renews nothing and is given up."""
        sent = lease_clock()
        try:
            async with asyncio.timeout(self._lease_s):
                await self._pool.stub(self._leader_of(session.shard)).KeepAlive(heartbeat)
            session.alive_until = max(session.alive_until, sent + self._lease_s)
        except grpc.aio.AioRpcError as e:
            if session_not_found(e):
                self.forget(session.shard, session.session_id)
                return
            # Anything else (a leader move's custom codes, a transport error) is retried on the
            # next beat, as the Go client does: the session survives until its timeout.
            log.info("oxia_session_keepalive_failed", shard=session.shard,
                     error=f"{e.code().name}: {e.details()}")
        except (TimeoutError, StoreUnavailableError):
            log.info("oxia_session_keepalive_timeout", shard=session.shard)
        except StoreClosedError:
            return  # close() is under way: it closes the session
