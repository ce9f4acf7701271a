"""Commands in pods through the pod exec API (a websocket to the API server; no kubectl).

``python -m elastrain.backends.kubernetes_exec --namespace NS --pod P [--kubeconfig F] [--tty]
[--env KEY=VALUE | --env KEY]... [--exit-file F] -- COMMAND...`` runs COMMAND in the pod's node
container, in the tenant's home, and relays its output (stdout and stderr) and exit code (also to F:
a job's exit file on this machine): the `subprocess.Popen` the `Backend` ABC returns from ``exec`` is
this process. ``--env KEY`` alone takes the value from this process's environment, so a token never
shows in this machine's ``ps`` (as with ``podman exec``).
With ``--tty`` it relays its own terminal (the portal's pty) both ways. An exec the API refuses (the pod
not running yet, no such pod, RBAC) prints one line and exits with 126.

The exec API cannot signal the command: SIGTERM here closes the stream only. The backend stops
commands inside the pod by their environment tag (`signal_script`).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
from pathlib import Path
from typing import Any

from elastrain.backends.kubernetes_objects import NODE_CONTAINER

CANNOT_EXEC = 126
# run in the tenant's home, as the image's login shell would start
_IN_HOME = 'cd "$HOME" 2>/dev/null; exec "$@"'
# signal the pod's processes whose environment holds argv[1]=argv[2] (not this one), with signal argv[3]
SIGNAL_SCRIPT = """
import os, sys
needle, me = (sys.argv[1] + "=" + sys.argv[2]).encode(), os.getpid()
for pid in [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]:
    try:
        if needle in open(f"/proc/{pid}/environ", "rb").read().split(b"\\0"):
            os.kill(pid, int(sys.argv[3]))
    except OSError:
        pass
"""


def in_pod_argv(env: dict[str, str], command: list[str]) -> list[str]:
    """The argv the exec API runs: `command` with `env` added, in the tenant's home."""
    pairs = [f"{key}={value}" for key, value in sorted(env.items())]
    return ["env", *pairs, "sh", "-c", _IN_HOME, "elastrain-exec", *command]


def signal_argv(env_key: str, env_value: str, signum: int) -> list[str]:
    """The argv signalling the pod's processes tagged ``env_key=env_value`` (`SIGNAL_SCRIPT`)."""
    return ["python", "-c", SIGNAL_SCRIPT, env_key, env_value, str(signum)]


def open_exec(core: Any, namespace: str, pod: str, argv: list[str], tty: bool = False) -> Any:
    """A websocket client (`kubernetes.stream.ws_client.WSClient`) running `argv` in `pod`."""
    from kubernetes.stream import stream

    return stream(
        core.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        container=NODE_CONTAINER,
        command=argv,
        stdin=tty,
        stdout=True,
        stderr=True,
        tty=tty,
        binary=True,
        _preload_content=False,
    )


def exec_failure(exc: Exception) -> str:
    """The API's reason for refusing an exec, in one line."""
    body = getattr(exc, "body", None)
    if body:
        try:
            return str(json.loads(body).get("message") or body)
        except (TypeError, ValueError):
            return str(body)
    return (str(getattr(exc, "reason", "") or exc).strip().splitlines() or [type(exc).__name__])[0]


def run_in_pod(
    core: Any, namespace: str, pod: str, argv: list[str], timeout: float = 30
) -> tuple[int, bytes]:
    """Run `argv` in `pod` to its end: (exit code, stdout+stderr); `CANNOT_EXEC` when refused."""
    try:
        ws = open_exec(core, namespace, pod, argv)
    except Exception as exc:  # ApiException with the handshake's status, or a connection error
        return CANNOT_EXEC, exec_failure(exc).encode()
    try:
        ws.run_forever(timeout=timeout)
        output = ws.read_stdout(timeout=0) or b""
        output += ws.read_stderr(timeout=0) or b""
        code = ws.returncode
    finally:
        ws.close()
    return (code if code is not None else CANNOT_EXEC), _bytes(output)


def _bytes(data: Any) -> bytes:
    return data if isinstance(data, bytes) else str(data).encode()


def _relay(ws: Any) -> int:
    """Copy the command's output to ours until it ends; its exit code."""
    out = sys.stdout.buffer
    while ws.is_open():
        ws.update(timeout=1)
        for data in (ws.read_stdout(timeout=0), ws.read_stderr(timeout=0)):
            if data:
                out.write(_bytes(data))
                out.flush()
    code = ws.returncode
    return code if code is not None else CANNOT_EXEC


def _window_size(ws: Any) -> None:
    try:
        columns, lines = os.get_terminal_size(sys.stdin.fileno())
    except OSError:
        return
    ws.write_channel(4, json.dumps({"Width": columns, "Height": lines}))


def _relay_tty(ws: Any) -> int:
    """Relay our terminal to the pod's and back until the shell ends."""
    import termios
    import tty as ttymod

    stdin = sys.stdin.fileno()
    saved = termios.tcgetattr(stdin) if os.isatty(stdin) else None
    if saved is not None:
        ttymod.setraw(stdin)
    signal.signal(signal.SIGWINCH, lambda *_: _window_size(ws))
    _window_size(ws)
    out = sys.stdout.buffer
    try:
        while ws.is_open():
            ws.update(timeout=0.05)
            data = ws.read_stdout(timeout=0)
            if data:
                out.write(_bytes(data))
                out.flush()
            readable, _w, _x = select.select([stdin], [], [], 0)
            if readable:
                typed = os.read(stdin, 65536)
                if not typed:
                    break
                ws.write_stdin(typed)
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
    code = ws.returncode
    return code if code is not None else 0


def parse_env(items: list[str], environ: dict[str, str]) -> dict[str, str]:
    """``KEY=VALUE`` items, and ``KEY`` items whose value comes from `environ`."""
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        env[key] = value if sep else environ.get(key, "")
    return env


def main(argv: list[str] | None = None) -> int:
    """Run one command in a pod (see the module docstring); its exit code."""
    from kubernetes import client

    from elastrain.backends.kubernetes_client import KubernetesError, connect

    parser = argparse.ArgumentParser(prog="python -m elastrain.backends.kubernetes_exec")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--pod", required=True)
    parser.add_argument("--kubeconfig", type=Path)
    parser.add_argument("--tty", action="store_true")
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument(
        "--exit-file", type=Path, help="also write the exit code here (a job's, on this machine)"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        conn = connect(args.kubeconfig, args.namespace)
    except KubernetesError as exc:
        print(f"elastrain: {exc}", file=sys.stderr)
        return CANNOT_EXEC
    core = client.CoreV1Api(conn.api_client)
    env = parse_env(args.env, dict(os.environ))
    try:
        ws = open_exec(core, args.namespace, args.pod, in_pod_argv(env, command), tty=args.tty)
    except Exception as exc:
        print(f"elastrain: cannot run a command in pod {args.pod}: {exec_failure(exc)}", file=sys.stderr)
        return CANNOT_EXEC
    try:
        code = _relay_tty(ws) if args.tty else _relay(ws)
    except SystemExit as stopped:  # SIGTERM: the command was stopped
        write_exit_file(args.exit_file, stopped.code if isinstance(stopped.code, int) else 1)
        raise
    finally:
        ws.close()
    write_exit_file(args.exit_file, code)
    return code


def write_exit_file(path: Path | None, code: int) -> None:
    """Write `code` to `path` atomically (0600, never through a symbolic link), as jobrun does in the
    pod: the server reads a job's exit code from this machine's copy of the job directory."""
    if path is None:
        return
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{code}\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
