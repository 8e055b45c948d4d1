"""A real Apache Pulsar proxy (``pulsar-proxy`` 4.0.8, ``org.apache.pulsar.proxy.server.ProxyServiceStarter``)
for the tests, from the jars ``make pulsar-proxy`` resolves (tests/proxy/pom.xml; 4.2.x's proxy is not on
Maven Central).

It runs on 127.0.0.1 and free ports with a configuration file of our own: ``brokerServiceURL`` names what
it looks topics up through (tc-server, in tests/e2e/test_pulsar_proxy.py), token authentication of its
clients, and its own token toward what it connects to. It then connects to tc-server and to brokers with
that token and names each client in CONNECT's ``original_principal``, as in production.
"""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tc_server.bench.process import LoggedProcess, free_port, log_tail_of, spawn_logged, terminate_process
from tc_server.bench.pulsar_broker import ADD_OPENS, CLUSTER, BrokerStartError, broker_jars
from tests.support.pulsar_broker import TOKEN_PLUGIN, TOKEN_PROVIDER

PROXY_LIB, PROXY_STAMP = broker_jars("pulsar-proxy")
MAKE_COMMAND = "make pulsar-proxy"
MAIN_CLASS = "org.apache.pulsar.proxy.server.ProxyServiceStarter"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


class PulsarProxy(LoggedProcess):
    """One proxy under ``workdir``: clients authenticate with HS256 tokens of ``secret``; it presents
    ``proxy_token`` (its role) to ``service_url`` (and to the brokers lookups name), whose web service is
    ``web_service_url``."""

    KILL_WAIT_S = 20.0

    def __init__(self, workdir: Path, service_url: str, web_service_url: str, secret: bytes,
                 proxy_token: str) -> None:
        self.workdir = workdir
        self.service_url = service_url
        self.web_service_url = web_service_url
        self.secret = secret
        self.proxy_token = proxy_token
        self.port = free_port()
        self.web_port = free_port()
        self.config_path = workdir / "proxy.conf"
        self.log_path = workdir / "proxy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def config(self) -> dict[str, str]:
        return {
            "clusterName": CLUSTER,
            "bindAddress": "127.0.0.1",
            "advertisedAddress": "127.0.0.1",
            "servicePort": str(self.port),
            "webServicePort": str(self.web_port),
            # Static discovery: every lookup goes to the service URL (tc-server); no metadata store.
            "brokerServiceURL": self.service_url,
            "brokerWebServiceURL": self.web_service_url,
            "authenticationEnabled": "true",
            "authenticationProviders": TOKEN_PROVIDER,
            "tokenSecretKey": "data:;base64," + base64.b64encode(self.secret).decode(),
            "brokerClientAuthenticationPlugin": TOKEN_PLUGIN,
            "brokerClientAuthenticationParameters": f"token:{self.proxy_token}",
            # Its default: the client's credentials stay at the proxy; only its role is named onwards.
            "forwardAuthorizationCredentials": "false",
            # The proxy connects only to ports it is told are brokers' (default 6650,6651); ours are free ports.
            "brokerProxyAllowedTargetPorts": "*",
        }

    def start(self, timeout_s: float = START_TIMEOUT_S) -> PulsarProxy:
        java = shutil.which("java")
        if java is None:
            raise BrokerStartError("java not found on PATH: the Pulsar proxy needs a Java 17+ JDK")
        if not PROXY_STAMP.exists():
            raise BrokerStartError(f"the Pulsar proxy's jars are missing ({PROXY_LIB}): run `{MAKE_COMMAND}`")
        # Its JVM's temporary files (native libraries it unpacks and never deletes) go with the proxy.
        (self.workdir / "tmp").mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("".join(f"{key}={value}\n" for key, value in self.config().items()))
        opens = [arg for module in ADD_OPENS for arg in ("--add-opens", f"{module}=ALL-UNNAMED")]
        self.proc = spawn_logged([java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-Djava.net.preferIPv4Stack=true",
                                  f"-Djava.io.tmpdir={self.workdir / 'tmp'}", *opens,
                                  "-cp", f"{PROXY_LIB}/*", MAIN_CLASS, "--config", str(self.config_path)],
                                 self.log_path, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerStartError(f"the Pulsar proxy exited with {self.proc.returncode}\n{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.5)
        raise BrokerStartError(f"the Pulsar proxy did not listen on {self.port} in time\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None:
            terminate_process(self.proc, STOP_TIMEOUT_S, self.KILL_WAIT_S)

    def log_tail(self, lines: int = 60) -> str:
        return log_tail_of(self.log_path, lines, "proxy log")
