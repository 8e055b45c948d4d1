"""The static split of ``--workers N`` (tc_server/workers.py) and its settings checks, without processes:
which coordinators, ports, URL and store directory worker k gets, and which data directories refuse
which N. The processes themselves: tests/server/test_workers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tc_server.config import ConfigError, Settings, load_settings
from tc_server.workers import WORKERS_FILE, WorkerCountMismatch, WorkerRole, check_worker_count, worker_admin_url


def test_worker_k_gets_its_coordinators_ports_url_and_store() -> None:
    settings = Settings(listen="0.0.0.0:6650", admin_listen="0.0.0.0:8080", workers=2, coordinators=5,
                        data_dir="/srv/tc")
    role = WorkerRole.of(settings, 1)
    assert role.coordinators == {1, 3}
    assert (role.settings.listen, role.settings.admin_listen) == ("0.0.0.0:6652", "0.0.0.0:8082")
    assert role.settings.advertised_url == "pulsar://127.0.0.1:6652"
    assert role.settings.data_dir == "/srv/tc/worker-1-of-2"
    assert (role.service_listen, role.service_url) == ("0.0.0.0:6650", "pulsar://127.0.0.1:6650")
    assert role.urls == {0: "pulsar://127.0.0.1:6651", 1: "pulsar://127.0.0.1:6652", 2: "pulsar://127.0.0.1:6651",
                         3: "pulsar://127.0.0.1:6652", 4: "pulsar://127.0.0.1:6651"}
    assert role.gc_coordinator == 1  # its own store: it collects it itself


def test_an_advertised_url_gives_each_worker_its_host_and_its_own_port() -> None:
    settings = Settings(listen="[::1]:7000", advertised_url="pulsar://tc.example:7000", workers=3, coordinators=16)
    role = WorkerRole.of(settings, 2)
    assert role.settings.listen == "[::1]:7003"
    assert role.settings.advertised_url == "pulsar://tc.example:7003"
    assert role.service_url == "pulsar://tc.example:7000"


TLS_FILES = {"tls_cert_file": "c.pem", "tls_key_file": "k.pem"}


def test_a_tls_listener_gives_each_worker_its_own_tls_port_beside_the_shared_one() -> None:
    settings = Settings(listen="0.0.0.0:6650", tls_listen="0.0.0.0:6660", admin_listen="0.0.0.0:8080",
                        admin_tls=True, workers=2, coordinators=4, tls_cert_file="c.pem", tls_key_file="k.pem")
    role = WorkerRole.of(settings, 1)
    assert role.settings.tls_listen == "0.0.0.0:6662"
    assert role.settings.advertised_url_tls == "pulsar+ssl://127.0.0.1:6662"
    assert role.settings.admin_tls  # its admin port is HTTPS as the supervisor's is, and probed so
    assert worker_admin_url(settings, 1) == "https://127.0.0.1:8082"
    assert (role.service_listen_tls, role.service_url_tls) == ("0.0.0.0:6660", "pulsar+ssl://127.0.0.1:6660")
    # LOOKUP names each coordinator's worker by its plain URL and, beside it, that worker's TLS URL.
    assert role.urls[2] == "pulsar://127.0.0.1:6651"
    assert role.tls_urls == {"pulsar://127.0.0.1:6651": "pulsar+ssl://127.0.0.1:6661",
                             "pulsar://127.0.0.1:6652": "pulsar+ssl://127.0.0.1:6662"}


def test_tls_only_workers_advertise_their_tls_urls_on_the_advertised_tls_host() -> None:
    settings = Settings(listen="", tls_listen="0.0.0.0:6651", advertised_url_tls="pulsar+ssl://tc.example:6651",
                        admin_listen="127.0.0.1:8080", workers=2, coordinators=4, tls_cert_file="c.pem",
                        tls_key_file="k.pem")
    role = WorkerRole.of(settings, 0)
    assert (role.settings.listen, role.settings.tls_listen) == ("", "0.0.0.0:6652")
    assert (role.settings.advertised_url, role.settings.advertised_url_tls) == ("", "pulsar+ssl://tc.example:6652")
    # Nothing plain to name: the TLS URL is the one URL of each worker (as a single TLS-only process's).
    assert role.urls == {0: "pulsar+ssl://tc.example:6652", 1: "pulsar+ssl://tc.example:6653",
                         2: "pulsar+ssl://tc.example:6652", 3: "pulsar+ssl://tc.example:6653"}
    assert role.tls_urls == {url: url for url in role.urls.values()}
    assert (role.service_listen, role.service_url) == ("", "pulsar+ssl://tc.example:6651")
    assert (role.service_listen_tls, role.service_url_tls) == ("0.0.0.0:6651", "pulsar+ssl://tc.example:6651")


def test_on_oxia_the_workers_share_the_store_and_one_gc() -> None:
    settings = Settings(store="oxia", workers=2, data_dir="/srv/tc")
    role = WorkerRole.of(settings, 1)
    assert role.settings.data_dir == "/srv/tc"
    assert role.gc_coordinator == 0


def test_a_worker_index_outside_the_workers_is_refused() -> None:
    with pytest.raises(ConfigError, match="worker index 2 outside 0..1"):
        WorkerRole.of(Settings(workers=2), 2)


@pytest.mark.parametrize(("flags", "named"), [
    ({"workers": "0"}, "workers: must be between 1 and 256"),
    ({"workers": "5", "coordinators": "4"}, "workers: must be at most coordinators"),
    ({"workers": "2", "listen": "127.0.0.1:0"}, "listen: must be a fixed port"),
    ({"workers": "2", "listen": ""}, "listen: must be a fixed port"),
    ({"workers": "2", "admin_listen": "127.0.0.1:0"}, "admin_listen: must be a fixed port"),
    ({"workers": "3", "listen": "127.0.0.1:65533"}, "listen: its port \\+ 3"),
    ({"workers": "2", "tls_listen": "127.0.0.1:0", **TLS_FILES}, "tls_listen: must be a fixed port"),
    ({"workers": "3", "tls_listen": "127.0.0.1:65533", **TLS_FILES}, "tls_listen: its port \\+ 3"),
    ({"workers": "2", "listen": "", "tls_listen": "127.0.0.1:0", **TLS_FILES}, "tls_listen: must be a fixed port"),
    ({"workers": "2", "listen": "0.0.0.0:6650", "tls_listen": "127.0.0.1:6651", **TLS_FILES},
     "tls_listen: its ports 6651-6653 overlap listen's 6650-6652 .*set them more than 2 apart"),
    ({"workers": "2", "listen": "127.0.0.1:6650", "admin_listen": "127.0.0.1:6648"},
     "listen: its ports 6650-6652 overlap admin_listen's 6648-6650"),
    # A name may be the other's address (the check compared the strings: a worker's bind failed instead).
    ({"workers": "2", "listen": "localhost:6650", "admin_listen": "127.0.0.1:6648"},
     "listen: its ports 6650-6652 overlap admin_listen's 6648-6650"),
])
def test_settings_that_cannot_make_workers_are_refused(flags: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_settings(flags=flags, environ={})


def test_the_environment_sets_workers() -> None:
    assert load_settings(environ={"TC_SERVER_WORKERS": "2"}).workers == 2


def test_a_data_dir_records_its_workers_and_refuses_another_count(tmp_path: Path) -> None:
    data = tmp_path / "data"
    check_worker_count(Settings(data_dir=str(data)))  # a fresh directory, one process: nothing recorded
    assert not (data / WORKERS_FILE).exists()
    check_worker_count(Settings(data_dir=str(data), workers=2))
    assert (data / WORKERS_FILE).read_text() == "2\n"
    check_worker_count(Settings(data_dir=str(data), workers=2))  # the same N again: fine
    for other in (1, 3):
        with pytest.raises(WorkerCountMismatch, match=f"holds the stores of --workers 2 but this start asked "
                                                      f"for --workers {other}"):
            check_worker_count(Settings(data_dir=str(data), workers=other))
    # The memory and Oxia stores keep nothing in the directory: no record, no refusal.
    check_worker_count(Settings(store="memory", data_dir=str(data), workers=3))


def test_a_single_process_store_is_workers_1_and_a_damaged_record_is_named(tmp_path: Path) -> None:
    single = tmp_path / "single"
    single.mkdir()
    (single / "tc-server.sqlite3").write_bytes(b"")
    with pytest.raises(WorkerCountMismatch, match="holds the stores of --workers 1"):
        check_worker_count(Settings(data_dir=str(single), workers=2))
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / WORKERS_FILE).write_text("two²\n")
    with pytest.raises(WorkerCountMismatch, match="does not hold a number of workers"):
        check_worker_count(Settings(data_dir=str(damaged), workers=2))


def test_the_stores_in_a_data_dir_say_its_workers_when_the_record_is_lost_or_damaged(tmp_path: Path) -> None:
    # The refusal of a damaged record said "fix or delete it"; deleted (or lost), any --workers started,
    # on new empty stores beside the ones that held the open transactions, which it then ignored.
    data = tmp_path / "data"
    check_worker_count(Settings(data_dir=str(data), workers=2))
    for index in range(2):
        (data / f"worker-{index}-of-2").mkdir()
    (data / WORKERS_FILE).write_text("x\n")
    with pytest.raises(WorkerCountMismatch, match="the stores there are of --workers 2: write the number"):
        check_worker_count(Settings(data_dir=str(data), workers=2))
    (data / WORKERS_FILE).unlink()
    with pytest.raises(WorkerCountMismatch, match="holds the stores of --workers 2 but this start asked for --wo"):
        check_worker_count(Settings(data_dir=str(data), workers=3))
    check_worker_count(Settings(data_dir=str(data), workers=2))  # the right count writes the record again
    assert (data / WORKERS_FILE).read_text() == "2\n"
    (data / "worker-0-of-3").mkdir()
    with pytest.raises(WorkerCountMismatch, match="holds stores of --workers 2, 3 and .* says 2"):
        check_worker_count(Settings(data_dir=str(data), workers=2))


def test_a_data_dir_that_is_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=f"--data-dir {tmp_path / 'file'}: File exists"):
        check_worker_count(Settings(data_dir=str(tmp_path / "file"), workers=2))


def test_the_workers_record_is_written_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Written in place without fsync, a machine crash soon after the first start could leave it empty,
    # and every later start refused the directory. Now a synced temporary file is renamed over it.
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    data = tmp_path / "data"
    check_worker_count(Settings(data_dir=str(data), workers=2))
    assert (data / WORKERS_FILE).read_text() == "2\n"
    assert len(synced) == 2  # the file, then its directory
    assert sorted(p.name for p in data.iterdir()) == [WORKERS_FILE]


def test_ipv6_addresses_make_bracketed_worker_urls_and_admin_probes() -> None:
    # An IPv6 host lost its brackets (pulsar://::1:7001), and the supervisor asked the workers' admin
    # ports on [::] at 127.0.0.1, where aiohttp (then IPv6 only on ::) did not listen: never ready.
    settings = Settings(listen="[::1]:7000", admin_listen="[::]:8080", workers=2, coordinators=4)
    assert WorkerRole.of(settings, 0).settings.advertised_url == "pulsar://[::1]:7001"
    assert worker_admin_url(settings, 1) == "http://[::1]:8082"
    advertised = Settings(listen="[::]:7000", advertised_url="pulsar://[fd00::5]:7000", workers=2, coordinators=4)
    role = WorkerRole.of(advertised, 1)
    assert role.settings.advertised_url == "pulsar://[fd00::5]:7002"
    assert role.urls[0] == "pulsar://[fd00::5]:7001"
    assert role.settings.validate() is role.settings
