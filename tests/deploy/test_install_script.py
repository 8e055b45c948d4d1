"""deploy/install.sh builds a working tc-server venv from the image's build context (PyPI needed)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from .manifests import ROOT


def locked_versions() -> dict[str, str]:
    """name -> version of every package in uv.lock."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    return {package["name"]: package["version"] for package in lock["package"] if "version" in package}


def image_context() -> list[str]:
    make = (ROOT / "mk" / "deploy.mk").read_text()
    match = re.search(r"^IMAGE_CONTEXT\s*:=\s*(.+)$", make, re.MULTILINE)
    assert match
    return match.group(1).split()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_install_script_builds_a_runnable_venv(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for rel in image_context():
        path = ROOT / rel
        if path.is_dir():
            shutil.copytree(path, src / rel, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        elif path.exists():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / rel)
    prefix = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PYTHON"] = sys.executable
    done = subprocess.run([str(src / "deploy" / "install.sh"), str(prefix), str(src)], env=env,
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout + done.stderr

    help_run = subprocess.run([str(prefix / "bin" / "tc-server"), "--help"], capture_output=True, text=True)
    assert help_run.returncode == 0, help_run.stderr
    assert "run" in help_run.stdout

    # Runtime dependencies only: the dev and audit extras (and pip, uv) stay out of the image, and what
    # is there is what uv.lock pins.
    listing = subprocess.run(
        [str(prefix / "bin" / "python"), "-c",
         "import importlib.metadata as m; "
         "print('\\n'.join(f'{d.name.lower()}=={d.version}' for d in m.distributions()))"],
        capture_output=True, text=True, check=True).stdout.split()
    installed = dict(line.split("==") for line in listing)
    for extra in ("pytest", "pyspark", "pyarrow", "mypy", "pulsar-client", "hypothesis", "pip", "uv"):
        assert extra not in installed, f"{extra} is installed"
    pinned = locked_versions()
    for name, version in installed.items():
        if name.replace("_", "-") != "tc-server":
            assert pinned.get(name.replace("_", "-")) == version, f"{name}=={version} is not what uv.lock pins"

    smoke = subprocess.run([str(prefix / "bin" / "python"), str(ROOT / "deploy" / "smoke.py"),
                            str(prefix / "bin" / "tc-server")], capture_output=True, text=True, timeout=120)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr


def test_install_script_refuses_bad_usage(tmp_path: Path) -> None:
    script = str(ROOT / "deploy" / "install.sh")
    assert subprocess.run([script], capture_output=True).returncode == 2
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").touch()
    refused = subprocess.run([script, str(tmp_path)], capture_output=True, text=True)
    assert refused.returncode == 1 and "fresh" in refused.stderr
