"""The two Containerfiles (base, final) and the ``podman build`` that runs them, offline.

Wheels reach the build through ``RUN --mount=type=bind`` (never ``COPY``), so no wheel is left in any
layer; pip runs with ``--no-cache-dir`` and ``--no-index``, and the build has no network at all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from elastrain.backends.podmanctl import PodmanError, podman, ulimit_args
from elastrain.images.recipe import EXAMPLES_DIR, VENV

PIP_OFFLINE = "--no-index --no-cache-dir --disable-pip-version-check"
# ssh between a cluster's containers uses the cluster's keys (mounted at /etc/elastrain/keys), never
# keys made when the image was built: those the Debian packages generate are removed below
SSH_CLIENT_CONFIG = """Host *
    IdentityFile ~/.ssh/id_ed25519
    IdentityFile /etc/elastrain/keys/id_ed25519
    GlobalKnownHostsFile /etc/elastrain/keys/known_hosts
    UserKnownHostsFile ~/.ssh/known_hosts
    StrictHostKeyChecking accept-new
    LogLevel ERROR
"""
SSH_CONFIG_FILE = "elastrain-ssh.conf"


def _labels(labels: Mapping[str, str]) -> str:
    body = " \\\n      ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"LABEL {body}\n"


def base_containerfile(rootfs_ref: str, labels: Mapping[str, str]) -> str:
    """Rootfs + a venv with the third-party wheels of ``wheels/`` (requirements and constraints inside)
    + the ssh client configuration (`SSH_CONFIG_FILE` in the context: `write_base_files`)."""
    return (
        f"FROM {rootfs_ref}\n"
        "RUN --mount=type=bind,source=wheels,target=/wheels \\\n"
        f"    python3 -m venv {VENV} \\\n"
        f" && {VENV}/bin/python -m pip install {PIP_OFFLINE} --find-links /wheels \\\n"
        "      -r /wheels/requirements.txt -c /wheels/constraints.txt \\\n"
        f" && mkdir -p /etc/mpi /var/log/jobs {EXAMPLES_DIR} /etc/elastrain/keys \\\n"
        " && chmod 1777 /home /var/log/jobs \\\n"
        " && rm -f /etc/ssh/ssh_host_* /etc/munge/munge.key \\\n"
        " && rm -rf /root/.cache /tmp/* \n"
        f"COPY {SSH_CONFIG_FILE} /etc/ssh/ssh_config.d/elastrain.conf\n"
        f"ENV PATH={VENV}/bin:$PATH PYTHONUNBUFFERED=1 ELASTRAIN_IMAGE=1\n"
        "WORKDIR /\n" + _labels(labels)
    )


def write_base_files(context: Path) -> None:
    """The files `base_containerfile` copies from its build context."""
    (context / SSH_CONFIG_FILE).write_text(SSH_CLIENT_CONFIG)


def layer_containerfile(base_ref: str, labels: Mapping[str, str]) -> str:
    """Base + a framework's own packages (``wheels/requirements.txt``, wheels and constraints inside)."""
    return (
        f"FROM {base_ref}\n"
        "RUN --mount=type=bind,source=wheels,target=/wheels \\\n"
        f"    {VENV}/bin/python -m pip install {PIP_OFFLINE} --find-links /wheels \\\n"
        "      -r /wheels/requirements.txt -c /wheels/constraints.txt \\\n"
        " && rm -rf /root/.cache /tmp/*\n"
        "WORKDIR /\n" + _labels(labels)
    )


def final_containerfile(base_ref: str, wheel_names: Sequence[str], labels: Mapping[str, str]) -> str:
    """Base (or layer) + the elastrain wheel and the compat wheels (from ``dist/``, no dependencies) +
    the examples (from ``examples/``)."""
    wheels = " ".join(f"/dist/{name}" for name in wheel_names)
    return (
        f"FROM {base_ref}\n"
        f"COPY examples/ {EXAMPLES_DIR}/\n"
        "RUN --mount=type=bind,source=dist,target=/dist \\\n"
        f"    {VENV}/bin/python -m pip install {PIP_OFFLINE} --no-deps {wheels} \\\n"
        " && rm -rf /root/.cache\n"
        "WORKDIR /\n" + _labels(labels)
    )


def podman_build(
    context: Path, containerfile: str, tags: Sequence[str], log: Path, timeout: float = 1800.0
) -> str:
    """``podman build`` `containerfile` in `context` with no network; the new image's ID.

    The full output goes to `log`; a failure raises `PodmanError` with its last line and the log's path.
    """
    (context / "Containerfile").write_text(containerfile)
    iidfile = context / ".iid"
    iidfile.unlink(missing_ok=True)
    # --no-cache: the wheels reach RUN steps through bind mounts, which buildah's layer cache does not
    # hash; a cached layer would keep the previous build's elastrain (our own keys decide what to build)
    args = ["build", "--pull=never", "--network", "none", "--no-cache", "--force-rm", *ulimit_args()]
    for tag in tags:
        args += ["--tag", tag]
    args += ["--iidfile", str(iidfile), "--file", str(context / "Containerfile"), str(context)]
    done = podman(*args, timeout=timeout, check=False)
    log.write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith(("ERROR", "Error", "error"))]
        last = (errors or lines or ["(no output)"])[-1]
        raise PodmanError(f"podman build of {tags[0]} failed: {last} (log: {log})")
    return iidfile.read_text().strip()
