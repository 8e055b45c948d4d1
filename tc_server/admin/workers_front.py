"""The supervisor's ``/admin/v3/transactions`` (``--workers N``): one admin URL for the whole machine.

Each worker serves the transactions API over its own coordinators (coordinator i is worker i mod N's) on
its own admin port, ``--admin-listen``'s port + 1 + k; on the embedded store only that worker's store
holds them. An operator gives ``pulsar-admin`` one admin URL, the one they configured: here the
supervisor forwards a request about one coordinator (a txn id's ``most``, or ``?coordinatorId=``) to the
worker that leads it, and asks every worker for a listing over all coordinators (``coordinatorStats``,
``slowTransactions`` and ``undelivered`` without ``coordinatorId``), merged into one answer: one page in
txn id order with the paging headers a worker gives (routes.py, DEFAULT_PAGE). A worker's ``undelivered`` lists
its own coordinators on either store (on Oxia it marks the participants acknowledged only for those); on Oxia,
where every worker reads the one store, worker 0 lists every coordinator's slow txns itself. What a worker answers
(its errors included) is passed on as it is; a worker that does not answer is a 503 naming it and the
coordinators it leads.

Credentials: the supervisor's own admin server checks them first (a superuser, as a worker does); the
``Authorization`` header (and a proxy's ``X-Original-Principal``) is then passed on for the worker to check
again. A client certificate cannot be
passed on: with ``--authentication-providers`` ``tls`` only, ask the worker's port itself (README, *Several
cores*). Over HTTPS (``--admin-tls``) the worker must present the very certificate the supervisor serves
(the same files), so a header is never sent to another process that took a worker's port while it restarted.
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Callable, Sequence

import aiohttp
from aiohttp import web

from tc_server.admin.http import ORIGINAL_PRINCIPAL_HEADER
from tc_server.admin.routes import NEXT_HEADER, PREFIX, json_response, page_parameters, paged, parse_txn_id
from tc_server.auth.certificates import first_certificate_der
from tc_server.config import Settings
from tc_server.healthcheck import admin_probe_tls_context

# A listing reads up to a page of txns with their participants from each worker's store.
FORWARD_TIMEOUT_S = 60.0
# The headers of a worker's answer that mean something to the client; the rest (Date, Server, lengths) the
# supervisor's own server sets.
_PASSED_ON = ("Content-Type", NEXT_HEADER, "Link", "Location", "Allow", "WWW-Authenticate")
_CHECKED_AGAIN = ("Authorization", ORIGINAL_PRINCIPAL_HEADER)
# Paths naming one txn: its ``most`` is its coordinator.
_ONE_TXN = re.compile(r"(?:transactionMetadata|abortTransaction|abort|undelivered)/([^/]+)/[^/]+(?:/drop)?")
_DIGITS = re.compile(r"[0-9]{1,19}")


class WorkerCertificates:
    """How a worker's admin port is asked with credentials over HTTPS (``--admin-tls``): trusting only the
    certificate this process serves itself (``--tls-cert-file``'s first certificate: a CA of one certificate,
    which OpenSSL accepts with partial chains allowed), and the one before it, with the server's own as client
    certificate where the admin port requires one (admin_probe_tls_context). The workers reload the files on
    timers of their own: after a rotation a worker presents the old certificate or the new one for a while,
    and trusting one only failed calls with "certificate verify failed"."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._trusted: list[bytes] = []  # DER, the newest last; at most two
        self._context: ssl.SSLContext | None = None

    def context(self) -> ssl.SSLContext:
        """Raises OSError or ValueError (a file being replaced: the next call reads it again)."""
        if self._context is None:
            self.refresh()
        assert self._context is not None
        return self._context

    def refresh(self) -> None:
        """Read the certificate file again (a worker presented another certificate than those trusted: it may
        have been rotated). Raises OSError or ValueError."""
        context = admin_probe_tls_context(self._settings)
        assert context is not None, "--admin-tls"
        with open(self._settings.tls_cert_file, "rb") as pem:
            newest = first_certificate_der(pem.read())
        if newest not in self._trusted:
            self._trusted = [*self._trusted, newest][-2:]
        for der in self._trusted:
            context.load_verify_locations(cadata=der)
        context.verify_mode = ssl.CERT_REQUIRED
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        self._context = context


class WorkersAdmin:
    """``admin_urls``: worker k's admin base URL (``http(s)://host:port``); ``coordinators``: how many there
    are (for what a 503 names); ``credentials_checked``: authentication is on (the workers check the
    credentials again); ``shared_store``: the workers share one store (Oxia), each reading every
    coordinator's records, rather than a store each (embedded); ``session``: the supervisor's HTTP client
    session, as of this request; ``tls``: the certificates to trust over HTTPS (None: HTTP)."""

    def __init__(self, admin_urls: Sequence[str], coordinators: int, session: Callable[[], aiohttp.ClientSession],
                 tls: WorkerCertificates | None, *, credentials_checked: bool, shared_store: bool) -> None:
        self._urls = list(admin_urls)
        self._shared_store = shared_store
        self._coordinators = coordinators
        self._session = session
        self._tls = tls
        self._credentials_checked = credentials_checked

    def add_to(self, app: web.Application) -> None:
        app.router.add_route("*", PREFIX + "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        if self._credentials_checked and "Authorization" not in request.headers:
            # Authenticated by its client certificate (the supervisor's admin server let it in): a worker would
            # answer 401, as nothing it can check is passed on.
            workers = ", ".join(f"{k}: {url}" for k, url in enumerate(self._urls))
            return json_response(401, {"reason": "a client certificate cannot be passed on to the workers that "
                                                 "hold the transactions: use a token here, or ask the admin port of "
                                                 f"the worker that leads the coordinator (i mod {len(self._urls)}; "
                                                 f"{workers})"})
        if any(segment in (".", "..") for segment in request.path.split("/")):
            # The worker's URL is built from this path, and a client library collapses dot segments: forwarded
            # as it is, /admin/v3/transactions/../../../metrics reached the worker's /metrics.
            return json_response(404, {"reason": f"no such endpoint: {request.method} {request.path[:200]}"})
        tail = request.match_info["tail"]
        if one_txn := _ONE_TXN.fullmatch(tail):  # the txn's own coordinator, whatever ?coordinatorId= says
            return await self._forward(self._owner(one_txn[1]), request)
        coordinator = request.query.get("coordinatorId")
        if coordinator is not None:
            return await self._forward(self._owner(coordinator), request)
        if request.method == "GET" and tail == "coordinatorStats":
            return await self._stats(request)
        if request.method == "GET" and tail.startswith("slowTransactions/"):
            if self._shared_store:
                # Every worker reads every coordinator's txns from the one store (Oxia): one lists them all.
                # Merged, each txn came once per worker.
                return await self._forward(0, request)
            return await self._listing(request, slow=True)
        if request.method == "GET" and tail == "undelivered":
            # Each worker lists its own coordinators' (routes.py, own_coordinators), on Oxia too: the
            # "acknowledged" marks are the memory of the worker that leads the txn's coordinator (worker 0 alone
            # listed every coordinator's, the other workers' txns without them).
            return await self._listing(request, slow=False)
        # coordinators (every worker knows every coordinator's leader), and what no coordinator answers
        # (the brokers' stats paths, scaling, unknown paths): worker 0 answers as any worker would.
        return await self._forward(0, request)

    def _owner(self, text: str) -> int:
        """The worker that leads coordinator ``text``; worker 0 for what is no coordinator id, which it
        answers 400 or 404 as it does on its own port."""
        return int(text) % len(self._urls) if _DIGITS.fullmatch(text) else 0

    async def _ask(self, k: int, request: web.Request) -> tuple[int, bytes, dict[str, str]] | web.Response:
        """Worker ``k``'s answer to ``request`` (status, body, the headers passed on), or the 503 saying it
        did not answer."""
        # The credentials, and the client a proxy role acts for (http.py), for the worker to check again.
        headers = {name: request.headers[name] for name in _CHECKED_AGAIN if name in request.headers}
        url = self._urls[k] + str(request.rel_url)
        for last_try in (False, True):
            try:
                tls = self._tls.context() if self._tls is not None else True
                async with self._session().request(request.method, url, headers=headers, ssl=tls,
                                                   allow_redirects=False,
                                                   timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)) as answer:
                    body = await answer.read()
                    passed_on = {name: answer.headers[name] for name in _PASSED_ON if name in answer.headers}
                    return answer.status, body, passed_on
            except aiohttp.ClientConnectorCertificateError as exc:
                # Nothing was sent. Another certificate than those trusted: read the file again (a rotation),
                # and try once more.
                if last_try or self._tls is None:
                    return self._not_answered(k, exc)
                try:
                    self._tls.refresh()
                except (OSError, ValueError) as unreadable:
                    return self._not_answered(k, unreadable)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                # OSError, ValueError: also the certificate file being replaced (WorkerCertificates).
                return self._not_answered(k, exc)
        raise AssertionError("unreachable: the last try returns")

    def _not_answered(self, k: int, exc: Exception) -> web.Response:
        """The 503 of a call worker ``k`` did not answer, naming it and its coordinators."""
        led = list(range(k, self._coordinators, len(self._urls)))
        return json_response(503, {"reason": f"worker {k} (admin port {self._urls[k]}), which leads coordinators "
                                             f"{led}, did not answer: {exc!r}"})

    async def _forward(self, k: int, request: web.Request) -> web.Response:
        asked = await self._ask(k, request)
        if isinstance(asked, web.Response):
            return asked
        status, body, headers = asked
        return web.Response(status=status, body=body, headers=headers)

    async def _ask_all(self, request: web.Request) -> list[tuple[object, dict[str, str]]] | web.Response:
        """Every worker's 200 answer (its JSON, its headers), in worker order; the first other answer as it is."""
        found: list[tuple[object, dict[str, str]]] = []
        for k in range(len(self._urls)):  # one after the other: a listing is a scan of each worker's store
            asked = await self._ask(k, request)
            if isinstance(asked, web.Response):
                return asked
            status, body, headers = asked
            if status != 200:
                return web.Response(status=status, body=body, headers=headers)
            found.append((json.loads(body), headers))
        return found

    async def _stats(self, request: web.Request) -> web.Response:
        """Each coordinator's entry from the worker that leads it (the others say NotLeader)."""
        answers = await self._ask_all(request)
        if isinstance(answers, web.Response):
            return answers
        workers = len(self._urls)
        merged: dict[int, object] = {}
        for k, (doc, _) in enumerate(answers):
            assert isinstance(doc, dict)
            merged.update((int(key), stats) for key, stats in doc.items() if int(key) % workers == k)
        return json_response(200, {str(tc_id): merged[tc_id] for tc_id in sorted(merged)})

    async def _listing(self, request: web.Request, *, slow: bool) -> web.Response:
        """slowTransactions (a map txn id -> metadata) or undelivered (a list, its unreadable records first)
        over every worker: the ``limit`` smallest txn ids of the workers' pages, and a next page when a
        worker has more or the pages hold more than ``limit`` together."""
        limit, _ = page_parameters(request)  # 400 here, once, for a bad one
        answers = await self._ask_all(request)
        if isinstance(answers, web.Response):
            return answers
        entries: list[tuple[tuple[int, int], str, object]] = []
        unreadable: list[object] = []
        more_elsewhere = False
        for doc, headers in answers:
            more_elsewhere |= NEXT_HEADER in headers
            if slow:
                assert isinstance(doc, dict)
                entries.extend((parse_txn_id(key, "txnId"), key, value) for key, value in doc.items())
                continue
            assert isinstance(doc, list)
            for item in doc:
                if item.get("txnId") is None:
                    unreadable.append(item)
                else:
                    entries.append((parse_txn_id(item["txnId"], "txnId"), item["txnId"], item))
        entries.sort(key=lambda entry: entry[0])
        last = None
        if len(entries) > limit or (more_elsewhere and len(entries) == limit):
            entries = entries[:limit]
            last = entries[-1][0]
        body: object = {key: value for _, key, value in entries} if slow else unreadable + [v for _, _, v in entries]
        return paged(json_response(200, body), request, last)
