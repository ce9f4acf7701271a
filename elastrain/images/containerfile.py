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


def _labels(labels: Mapping[str, str]) -> str:
    body = " \\\n      ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"LABEL {body}\n"


def base_containerfile(rootfs_ref: str, labels: Mapping[str, str]) -> str:
    """Rootfs + a venv with the third-party wheels of ``wheels/`` (requirements and constraints inside)."""
    return (
        f"FROM {rootfs_ref}\n"
        "RUN --mount=type=bind,source=wheels,target=/wheels \\\n"
        f"    python3 -m venv {VENV} \\\n"
        f" && {VENV}/bin/python -m pip install {PIP_OFFLINE} --find-links /wheels \\\n"
        "      -r /wheels/requirements.txt -c /wheels/constraints.txt \\\n"
        f" && mkdir -p /etc/mpi /var/log/jobs {EXAMPLES_DIR} \\\n"
        " && chmod 1777 /home /var/log/jobs \\\n"
        " && rm -rf /root/.cache /tmp/* \n"
        f"ENV PATH={VENV}/bin:$PATH PYTHONUNBUFFERED=1 ELASTRAIN_IMAGE=1\n"
        "WORKDIR /\n" + _labels(labels)
    )


def final_containerfile(base_ref: str, wheel_name: str, labels: Mapping[str, str]) -> str:
    """Base + the elastrain wheel (from ``dist/``, no dependencies) + the examples (from ``examples/``)."""
    return (
        f"FROM {base_ref}\n"
        f"COPY examples/ {EXAMPLES_DIR}/\n"
        "RUN --mount=type=bind,source=dist,target=/dist \\\n"
        f"    {VENV}/bin/python -m pip install {PIP_OFFLINE} --no-deps /dist/{wheel_name} \\\n"
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
