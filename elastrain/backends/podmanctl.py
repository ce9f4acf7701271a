"""The podman command line, wrapped: one place that knows its flags, its quirks and its errors.

Two quirks of the machines elastrain runs on are handled here, once:

* ``--runtime runc``: crun refuses hosts with a hybrid (v1 + v2) cgroup layout, runc does not;
* explicit ``--ulimit nofile=N:N --ulimit nproc=N:N`` no higher than this process's own limits (and
  ``kernel.pid_max``): raising a limit needs a capability such hosts do not grant, and podman's
  default asks for more than they allow.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Mapping
from typing import Any

from elastrain.backends.procs import niced
from elastrain.errors import ElastrainError

RUNTIME = "runc"


class PodmanError(ElastrainError):
    """podman is missing or a podman command failed; the message has podman's own last line."""


@functools.cache
def podman_path() -> str | None:
    """The podman executable, or None when it is not installed."""
    return shutil.which("podman")


def _first_error_line(stderr: str) -> str:
    lines = [
        line.strip()
        for line in stderr.splitlines()
        if line.strip() and "failed to connect to syslog" not in line and "level=warning" not in line
    ]
    return lines[-1] if lines else "(no message)"


def podman(
    *args: str,
    timeout: float = 120.0,
    check: bool = True,
    input_text: str | None = None,
    env: Mapping[str, str] | None = None,
    nice: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``podman --runtime runc ARGS`` (with `env` added to its environment: the values of
    ``--env KEY`` flags, kept out of argv); raises `PodmanError` (podman's message) when it fails.
    `nice`: run it `TENANT_NICE` levels down, so that what it starts (``podman run``: conmon, the
    container's init and every process in it) runs there too (a nice value is inherited)."""
    exe = podman_path()
    if exe is None:
        raise PodmanError(
            "podman is not installed; install it (apt-get install podman runc) or start the server "
            "with --backend process"
        )
    try:
        argv = [exe, "--runtime", RUNTIME, *args]
        done = subprocess.run(
            niced(argv) if nice else argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input_text,
            stdin=None if input_text is not None else subprocess.DEVNULL,
            env={**os.environ, **env} if env else None,
        )
    except subprocess.TimeoutExpired:
        raise PodmanError(f"podman {args[0]} did not answer within {timeout:.0f} s") from None
    if check and done.returncode != 0:
        raise PodmanError(f"podman {' '.join(args[:2])} failed: {_first_error_line(done.stderr)}")
    return done


def podman_log_tail(container: str, limit: int, timeout: float = 30.0) -> bytes:
    """The last `limit` bytes of ``podman logs CONTAINER`` (stdout and stderr), read as a stream: never
    more than `limit` plus one chunk in memory, whatever the log's size; empty for a missing container;
    `PodmanError` when podman does not finish within `timeout`."""
    exe = podman_path()
    if exe is None:
        raise PodmanError("podman is not installed; install it (apt-get install podman runc)")
    proc = subprocess.Popen(
        [exe, "--runtime", RUNTIME, "logs", container],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    tail = bytearray()
    try:
        while chunk := os.read(proc.stdout.fileno(), 1 << 16):
            tail += chunk
            if len(tail) > 2 * limit:
                del tail[: len(tail) - limit]
            if time.monotonic() > deadline:
                raise PodmanError(f"podman logs {container} did not finish within {timeout:.0f} s")
        code = proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
    except subprocess.TimeoutExpired:
        raise PodmanError(f"podman logs {container} did not finish within {timeout:.0f} s") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    if code != 0 and b"no such container" in tail[-4096:]:
        return b""  # a missing container has no log lines (as with every backend), not podman's error
    return bytes(tail[-limit:])


def podman_json(*args: str, timeout: float = 60.0) -> Any:
    """A podman command's JSON output (``--format json`` must be among `args`)."""
    out = podman(*args, timeout=timeout).stdout.strip()
    return json.loads(out) if out else []


def exec_argv(*args: str) -> list[str]:
    """argv that runs podman with the runtime flag (for commands run as long-lived processes)."""
    exe = podman_path()
    if exe is None:
        raise PodmanError("podman is not installed; install it (apt-get install podman runc)")
    return [exe, "--runtime", RUNTIME, *args]


def _pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 32768


def ulimit_args() -> list[str]:
    """``--ulimit`` flags pinned at this process's hard limits (never above them)."""
    out = []
    for name, which, cap in (
        ("nofile", resource.RLIMIT_NOFILE, 1 << 20),
        ("nproc", resource.RLIMIT_NPROC, _pid_max()),
    ):
        _soft, hard = resource.getrlimit(which)
        value = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
        out += ["--ulimit", f"{name}={value}:{value}"]
    return out


@functools.cache
def podman_works() -> bool:
    """True when podman is installed and can run a container here (probed once per process)."""
    if podman_path() is None:
        return False
    try:
        done = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", timeout=30, check=False)
    except PodmanError:
        return False
    return done.returncode == 0 and shutil.which(RUNTIME) is not None
