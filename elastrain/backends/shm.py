"""Enforcing a container's shared-memory size on the local backend, as ``docker run --shm-size`` does.

Where the OS allows it (root, util-linux ``unshare``), a container's processes run in a private mount
namespace whose ``/dev/shm`` is a tmpfs of the cluster's ``--shm`` size; elsewhere the size is only
recorded (``ELASTRAIN_SHM_BYTES``). ``unshare`` execs in place, so the PID the backend records is the
process that runs the command.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

# mount the sized tmpfs, then become the command; a failed mount warns and runs the command anyway
_SCRIPT = (
    'mount -t tmpfs -o "size=$0,mode=1777" elastrain-shm /dev/shm '
    '|| echo "elastrain: /dev/shm not limited to $0 bytes" >&2; exec "$@"'
)


@functools.cache
def shm_limit_supported() -> bool:
    """True when processes can get their own sized /dev/shm here (probed once)."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None or not os.path.isdir("/dev/shm"):
        return False
    probe = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "--", "sh", "-c", _SCRIPT, "65536", "true"],
        capture_output=True,
        timeout=10,
    )
    return probe.returncode == 0 and not probe.stderr


def with_shm_limit(argv: list[str], shm_bytes: int) -> list[str]:
    """`argv` wrapped to run with a /dev/shm of `shm_bytes` (unchanged where that is not possible)."""
    if shm_bytes <= 0 or not shm_limit_supported():
        return argv
    unshare = shutil.which("unshare") or "unshare"
    return [unshare, "--mount", "--propagation", "private", "--", "sh", "-c", _SCRIPT, str(shm_bytes), *argv]
