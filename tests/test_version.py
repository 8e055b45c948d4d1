"""One version, said everywhere it is said: pyproject.toml's, tc_server.__version__ (CONNECTED's
server_version, tc_server_build_info, ``tc-server --version``) and the image tag the Kubernetes
manifests deploy."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from tc_server import __version__
from tc_server.server.handshake import SERVER_VERSION

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_version_is_pyproject_s() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__
    assert SERVER_VERSION == f"tc-server {__version__}"


def test_tc_server_version_prints_it() -> None:
    done = subprocess.run([sys.executable, "-c", "import sys; from tc_server.cli import main; sys.exit(main())",
                           "--version"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0 and done.stdout == f"tc-server {__version__}\n", (done.stdout, done.stderr)


def test_the_manifests_deploy_the_image_of_this_version() -> None:
    for variant in ("standalone", "sidecar"):
        kustomization = yaml.safe_load((ROOT / "deploy" / "kubernetes" / variant / "kustomization.yaml").read_text())
        (image,) = kustomization["images"]
        assert image["newTag"] == __version__, variant
