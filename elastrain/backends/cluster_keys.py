"""A cluster's own keys: made once when the cluster is created, mounted read-only in its containers.

One set per cluster, never shared with another cluster or written into an image:

* ``ssh_host_ed25519_key`` (+ ``.pub``): every container's sshd presents it; ``known_hosts`` trusts it
  for any host name, so ``ssh <cluster>-worker-1`` needs no prompt;
* ``id_ed25519`` (+ ``.pub``) and ``authorized_keys``: the tenant's key between the containers (the
  images' ``/etc/ssh/ssh_config.d/elastrain.conf`` points ssh at it);
* ``munge.key``: the Slurm framework's munge key.

Files belong to the tenant's uid (the containers' user), private ones mode 0600, in a 0700 directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from elastrain.errors import ConfigError

HOST_KEY, USER_KEY, MUNGE_KEY = "ssh_host_ed25519_key", "id_ed25519", "munge.key"


def _keygen(path: Path, comment: str) -> None:
    exe = shutil.which("ssh-keygen")
    if exe is None:
        raise ConfigError("ssh-keygen is not installed; install openssh-client (make container-deps)")
    path.unlink(missing_ok=True)
    Path(f"{path}.pub").unlink(missing_ok=True)
    done = subprocess.run(
        [exe, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise ConfigError(f"ssh-keygen failed: {done.stderr.strip() or done.returncode}")


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def ensure_cluster_keys(keys: Path, cluster: str, uid: int) -> Path:
    """Create the keys of `cluster` in `keys` (kept when they exist) owned by `uid`; returns `keys`."""
    keys.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not (keys / HOST_KEY).exists():
        _keygen(keys / HOST_KEY, f"{cluster} host key")
    if not (keys / USER_KEY).exists():
        _keygen(keys / USER_KEY, f"{cluster} user key")
    host_pub = (keys / f"{HOST_KEY}.pub").read_text().split()
    (keys / "known_hosts").write_text(f"* {host_pub[0]} {host_pub[1]}\n")
    (keys / "authorized_keys").write_text((keys / f"{USER_KEY}.pub").read_text())
    if not (keys / MUNGE_KEY).exists():
        _write_private(keys / MUNGE_KEY, os.urandom(1024))
    for path in [keys, *keys.iterdir()]:
        try:
            os.chown(path, uid, uid, follow_symlinks=False)
        except PermissionError:  # not root: the files stay the server's (the process backend's case)
            pass
        private = path.is_file() and not path.name.endswith((".pub", "known_hosts", "authorized_keys"))
        os.chmod(path, 0o700 if path.is_dir() else 0o600 if private else 0o644)
    return keys
