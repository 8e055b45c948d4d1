"""The static split of ``--workers N`` (README, "Several cores"): coordinator i is led by worker i mod N.

Everything here is computed from the settings alone, the same way in the supervisor and in every worker,
so each worker knows every other worker's URL without asking anyone:

* worker k listens on ``--listen``'s port + 1 + k and advertises that port (on ``--advertised-url``'s
  host when one is set), besides sharing ``--listen``'s port with the other workers (SO_REUSEPORT);
  ``--tls-listen`` likewise (port + 1 + k advertised as its pulsar+ssl:// URL, the port itself shared);
* worker k's admin port is ``--admin-listen``'s port + 1 + k (HTTPS with ``--admin-tls``); the supervisor
  keeps ``--admin-listen``;
* on the embedded store worker k has its own store in ``<data-dir>/worker-<k>-of-<N>/`` (one writer per
  SQLite file keeps its group commit and its lock), and ``<data-dir>/workers`` records N, so that a
  start with another N, whose coordinators would land on the wrong stores, is refused.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from tc_server.config import ConfigError, Settings, is_wildcard, parse_hostport, url_host
from tc_server.healthcheck import admin_base_url

# Holds N in the data directory of a supervisor's workers (plain decimal text).
WORKERS_FILE = "workers"
# The single process's embedded store (tc_server/store/embedded.py DB_FILENAME): a data directory that
# holds it directly was made by --workers 1.
SINGLE_STORE_FILE = "tc-server.sqlite3"
# A worker's store directory (worker_data_dir): worker-<k>-of-<N>.
_STORE_DIRECTORY = re.compile(r"worker-\d+-of-(\d{1,4})")


class WorkerCountMismatch(ConfigError):
    """The data directory was made with another --workers; the message names the setting."""


def coordinators_of(index: int, count: int, coordinators: int) -> frozenset[int]:
    """The coordinators worker ``index`` of ``count`` leads: i with i mod count = index."""
    return frozenset(range(index, coordinators, count))


def _shifted(address: str, offset: int) -> str:
    host, port = parse_hostport(address)
    return f"{url_host(host)}:{port + offset}"


def _advertised_host_port(advertised: str, listen: str) -> tuple[str, int]:
    """The host (as a URL writes it) and port a worker's URL is built on: the advertised URL's, else the
    listener's (a wildcard address as the loopback address, which is what a client on this host reaches:
    the Pulsar listeners bind both families on ``::``)."""
    if advertised:
        parts = urlsplit(advertised)
        assert parts.hostname is not None and parts.port is not None  # Settings.validate checked
        return url_host(parts.hostname), parts.port
    host, port = parse_hostport(listen)
    return ("127.0.0.1" if is_wildcard(host) else url_host(host)), port


def worker_url(settings: Settings, index: int) -> str:
    """The ``pulsar://`` URL worker ``index`` advertises: its own port, on the advertised host."""
    host, port = _advertised_host_port(settings.advertised_url, settings.listen)
    return f"pulsar://{host}:{port + 1 + index}"


def worker_tls_url(settings: Settings, index: int) -> str:
    """The ``pulsar+ssl://`` URL worker ``index`` advertises: its own TLS port, on the advertised TLS host."""
    host, port = _advertised_host_port(settings.advertised_url_tls, settings.tls_listen)
    return f"pulsar+ssl://{host}:{port + 1 + index}"


def worker_main_url(settings: Settings, index: int) -> str:
    """The URL worker ``index`` is known by (its leader records', LOOKUP's brokerServiceUrl): the plain one,
    or with the plain listener off the TLS one, as a single process's."""
    return worker_url(settings, index) if settings.listen else worker_tls_url(settings, index)


def worker_admin_url(settings: Settings, index: int) -> str:
    """``http(s)://HOST:PORT`` of worker ``index``'s admin port, as the supervisor reaches it."""
    return admin_base_url(settings, 1 + index)


def worker_data_dir(settings: Settings, index: int) -> str:
    return str(Path(settings.data_dir) / f"worker-{index}-of-{settings.workers}")


@dataclass(frozen=True)
class WorkerRole:
    """What makes one process worker ``index`` of ``count``: its settings (own ports, URL and data
    directory), the shared service address, its coordinators and every coordinator's worker URL."""

    index: int
    count: int
    settings: Settings
    service_listen: str  # HOST:PORT shared by all workers (SO_REUSEPORT); empty: the plain listener is off
    service_url: str  # the URL clients are given for the service (--advertised-url or from --listen)
    service_listen_tls: str  # HOST:PORT of the TLS listener all workers share; empty: none
    service_url_tls: str  # its pulsar+ssl:// URL (--advertised-url-tls or from --tls-listen); empty: none
    coordinators: frozenset[int]
    urls: dict[int, str]  # tc_id -> URL of the worker that leads it
    tls_urls: dict[str, str]  # each worker's URL -> its pulsar+ssl:// URL (LOOKUP's brokerServiceUrlTls)
    # The coordinator whose leader runs GC: the store holds only this worker's coordinators on the
    # embedded store, so each worker collects its own; on a shared store (Oxia) one sweep for all.
    gc_coordinator: int
    # tc_id -> the admin port of the worker that leads it, for the coordinators another worker leads, on the
    # embedded store (whose store per worker holds only its own): the admin API redirects a request about one
    # of them there (tc_server/admin/routes.py). Empty on a shared store (Oxia), where every worker reads them.
    other_admin_ports: dict[int, int]

    @classmethod
    def of(cls, settings: Settings, index: int) -> WorkerRole:
        if not 0 <= index < settings.workers:
            raise ConfigError(f"worker index {index} outside 0..{settings.workers - 1} (--workers)")
        own_store = settings.store != "oxia"
        workers = range(settings.workers)
        plain, tls = bool(settings.listen), bool(settings.tls_listen)
        worker_settings = replace(
            settings,
            listen=_shifted(settings.listen, 1 + index) if plain else "",
            tls_listen=_shifted(settings.tls_listen, 1 + index) if tls else "",
            admin_listen=_shifted(settings.admin_listen, 1 + index),
            advertised_url=worker_url(settings, index) if plain else "",
            advertised_url_tls=worker_tls_url(settings, index) if tls else "",
            data_dir=worker_data_dir(settings, index) if own_store else settings.data_dir,
        )
        # Index -1: port + 1 - 1, the shared port's own URL.
        service_url_tls = (settings.advertised_url_tls or worker_tls_url(settings, -1)) if tls else ""
        service_url = (settings.advertised_url or worker_url(settings, -1)) if plain else service_url_tls
        _, admin_port = parse_hostport(settings.admin_listen)
        return cls(
            index=index, count=settings.workers, settings=worker_settings, service_listen=settings.listen,
            service_url=service_url, service_listen_tls=settings.tls_listen, service_url_tls=service_url_tls,
            coordinators=coordinators_of(index, settings.workers, settings.coordinators),
            urls={tc_id: worker_main_url(settings, tc_id % settings.workers) for tc_id in range(settings.coordinators)},
            tls_urls={worker_main_url(settings, k): worker_tls_url(settings, k) for k in workers} if tls else {},
            gc_coordinator=index if own_store else 0,
            other_admin_ports={tc_id: admin_port + 1 + tc_id % settings.workers
                               for tc_id in range(settings.coordinators)
                               if own_store and tc_id % settings.workers != index},
        )


def check_worker_count(settings: Settings) -> None:
    """Refuse a data directory made with another --workers (embedded store only: Oxia keeps one data
    set for any number of instances); record N in a fresh one when N > 1.

    Raises WorkerCountMismatch (one line naming --workers), OSError when the record cannot be read or
    written."""
    if settings.store != "embedded":
        return
    try:
        _check_worker_count(settings, Path(settings.data_dir))
    except OSError as exc:
        # The file named, not only the data directory: "--data-dir X: Is a directory" of X/workers (a review's).
        where = "" if exc.filename in (None, settings.data_dir) else f"{exc.filename}: "
        raise ConfigError(f"--data-dir {settings.data_dir}: {where}{exc.strerror or exc}") from exc


def store_directories(directory: Path) -> list[Path]:
    """The embedded stores' directories in the data directory ``directory``: each ``worker-<k>-of-<N>``, and
    ``directory`` itself when it holds a single process's store; sorted."""
    found = [path for path in directory.iterdir()
             if _STORE_DIRECTORY.fullmatch(path.name) is not None and path.is_dir()] if directory.is_dir() else []
    if (directory / SINGLE_STORE_FILE).exists():
        found.append(directory)
    return sorted(found)


def _stores_made(directory: Path) -> set[int]:
    """The N of every store directory ``worker-<k>-of-<N>`` in ``directory``, and 1 for a single
    process's store: what the data says, should the record be lost or replaced."""
    made: set[int] = set()
    for path in store_directories(directory):
        match = _STORE_DIRECTORY.fullmatch(path.name)
        made.add(1 if path == directory or match is None else int(match[1]))
    return made


def _check_worker_count(settings: Settings, directory: Path) -> None:
    resolved = directory.resolve()
    if (match := _STORE_DIRECTORY.fullmatch(resolved.name)) is not None and (
            int(match[1]) > 1 or (resolved.parent / WORKERS_FILE).exists()):
        # One worker's store holds only its own coordinators (i mod N): a process started on it leads every
        # coordinator, and the txns it opened on the others were in a store no worker leads them from again
        # (never timed out, their decisions never delivered). `tc-server export` may read it; run may not.
        raise WorkerCountMismatch(
            f"--data-dir {directory} is one worker's store of a --workers {match[1]} data directory (it holds "
            f"coordinator i only for i mod {match[1]} = its index): start with --workers {match[1]} "
            f"--data-dir {resolved.parent}")
    record = directory / WORKERS_FILE
    made = _stores_made(directory)
    stored: int | None = None
    if record.exists():
        try:
            text = record.read_text().strip()
        except UnicodeDecodeError:
            text = record.read_bytes()[:40].decode("ascii", "backslashreplace")  # named below, not a traceback
        if not (text.isascii() and text.isdigit() and len(text) <= 4):
            found = f"; the stores there are of --workers {', '.join(map(str, sorted(made)))}" if made else ""
            raise WorkerCountMismatch(f"{record} does not hold a number of workers (got {text[:40]!r}){found}: "
                                      "write the number of workers the stores were made with into it")
        stored = int(text)
    if len(made) > 1 or (made and stored is not None and made != {stored}):
        raise WorkerCountMismatch(
            f"the data directory {directory} holds stores of --workers {', '.join(map(str, sorted(made)))}"
            + (f" and {record} says {stored}" if stored is not None else "")
            + ": move the stores of the other counts out of it (coordinator i lives in worker i mod N's store)")
    if stored is None and made:
        (stored,) = made  # the record was lost: the stores say
    if stored is not None and stored != settings.workers:
        raise WorkerCountMismatch(
            f"the data directory {directory} holds the stores of --workers {stored} but this start asked for "
            f"--workers {settings.workers} (TC_SERVER_WORKERS): start with --workers {stored}, or use another "
            "--data-dir (coordinator i lives in worker i mod N's store)")
    if not record.exists() and settings.workers > 1:
        directory.mkdir(parents=True, exist_ok=True)
        _write_durably(record, f"{settings.workers}\n")


def _write_durably(path: Path, text: str) -> None:
    """Write ``path`` so that a machine crash leaves the whole file or none (a new file written without
    fsync can come back empty, and the next start would refuse the directory): a temporary file, synced,
    renamed over, and the directory synced."""
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
