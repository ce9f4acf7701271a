"""The container services: sshd's configuration, the session environment, the supervisor, the keys."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from elastrain.agent import services
from elastrain.backends.cluster_keys import ensure_cluster_keys


def test_sshd_config_is_key_only_with_the_containers_environment(tmp_path: Path) -> None:
    env = {
        "PATH": "/opt/elastrain/venv/bin:/usr/bin",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "ELASTRAIN_CLUSTER": "c",
        "ELASTRAIN_NOTE": 'a "quoted" value',
        "SECRET_OTHER": "not passed",
        "MULTI": "a\nb",
    }
    text = services.sshd_config(Path("/etc/elastrain/keys"), env, tmp_path)
    assert "Port 22\n" in text and "PasswordAuthentication no\n" in text and "UsePAM no\n" in text
    assert "HostKey /etc/elastrain/keys/ssh_host_ed25519_key\n" in text
    setenv = next(line for line in text.splitlines() if line.startswith("SetEnv "))
    assert "PATH=/opt/elastrain/venv/bin:/usr/bin" in setenv and "CUDA_VISIBLE_DEVICES=0,1" in setenv
    assert 'ELASTRAIN_NOTE="a \\"quoted\\" value"' in setenv
    assert "SECRET_OTHER" not in setenv and "MULTI" not in setenv


def test_no_sshd_service_without_keys(tmp_path: Path) -> None:
    assert services.sshd_service({}, keys=tmp_path, run_dir=tmp_path / "run") is None


def test_supervisor_restarts_a_service_that_exits(tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    script = f"open({str(marker)!r}, 'a').write('x')"
    supervisor = services.Supervisor([services.Service("once", [sys.executable, "-c", script])])
    supervisor.start()
    done = threading.Event()
    for _ in range(100):
        if marker.exists() and len(marker.read_text()) >= 2:
            done.set()
            break
        threading.Event().wait(0.1)
    supervisor.stop()
    assert done.is_set(), "the service was not started again after it exited"


@pytest.mark.skipif(not os.path.exists("/usr/bin/ssh-keygen"), reason="ssh-keygen is not installed")
def test_cluster_keys_are_made_once_and_private(tmp_path: Path) -> None:
    keys = ensure_cluster_keys(tmp_path / "keys", "c", os.getuid())
    host = (keys / "ssh_host_ed25519_key.pub").read_text().split()
    assert (keys / "known_hosts").read_text() == f"* {host[0]} {host[1]}\n"
    assert (keys / "authorized_keys").read_text() == (keys / "id_ed25519.pub").read_text()
    assert (keys / "munge.key").stat().st_size == 1024
    for name in ("ssh_host_ed25519_key", "id_ed25519", "munge.key"):
        assert (keys / name).stat().st_mode & 0o777 == 0o600
    assert keys.stat().st_mode & 0o777 == 0o700
    before = (keys / "id_ed25519").read_bytes()
    ensure_cluster_keys(keys, "c", os.getuid())  # a second call keeps the keys
    assert (keys / "id_ed25519").read_bytes() == before
