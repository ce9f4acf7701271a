"""What the abusive tenant of test_load_abuse runs in his own launcher container, as he ran it (issue 29).

Programs for ``python3`` inside the container (the image has no extra packages: standard library
only), and the shell lines that start them detached through the exec API.
"""

from __future__ import annotations

import shlex

FD_FLOOD = """
import socket, time
held = []
for _ in range(int(__import__('sys').argv[1])):
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect('/run/elastrain/api.sock')
        held.append(s)
    except OSError:
        break
print('held', len(held), flush=True)
time.sleep(3600)
"""
"""Opens connections to the in-container API socket (up to argv[1], or the container's descriptor limit)
and holds them; the report's 7,000 took the server's descriptors."""

WS_BOMB = """
import base64, hashlib, os, signal, socket, struct, sys, threading, time
PORT, SIZE = int(sys.argv[1]), int(sys.argv[2])
if not os.path.exists('/run/elastrain/api.sock'):
    sys.exit('not in an elastrain container: this stops every jupyterlab it sees')
for pid in os.listdir('/proc'):  # the tenant's own JupyterLab holds the lab port: he stops it
    try:
        if pid.isdigit() and b'jupyterlab' in open(f'/proc/{pid}/cmdline', 'rb').read():
            os.kill(int(pid), signal.SIGKILL)
    except OSError:
        pass
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
while True:
    try:
        server.bind(('0.0.0.0', PORT)); break
    except OSError:
        time.sleep(0.1)
server.listen(64)
print('listening', flush=True)
CHUNK = b'x' * (1 << 20)
def bomb(conn):
    try:
        request = b''
        while b'\\r\\n\\r\\n' not in request:
            request += conn.recv(4096) or b'\\r\\n\\r\\n'
        lines = request.split(b'\\r\\n')
        key = [l.split(b':', 1)[1].strip() for l in lines if l.lower().startswith(b'sec-websocket-key:')][0]
        accept = base64.b64encode(hashlib.sha1(key + b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest())
        conn.sendall(b'HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\n'
                     b'Connection: Upgrade\\r\\nSec-WebSocket-Accept: ' + accept + b'\\r\\n\\r\\n')
        conn.sendall(struct.pack('!BBQ', 0x82, 127, SIZE))  # one binary message of SIZE bytes
        for _ in range(SIZE >> 20):
            conn.sendall(CHUNK)
    except OSError:
        pass
    finally:
        conn.close()
while True:
    conn, _ = server.accept()
    threading.Thread(target=bomb, args=(conn,), daemon=True).start()
"""
"""Replaces the launcher's JupyterLab with a server whose every WebSocket sends one `SIZE`-byte message."""


ARG_CHARS = 1000  # the exec API takes arguments of at most 1024 characters


def detached(program: str, *args: object, name: str) -> list[list[str]]:
    """The exec commands that write `program` to /tmp/`name`.py (in pieces the API takes), then start
    it in the background with `args` (its output in /tmp/`name`.log)."""
    path = f"/tmp/{name}.py"
    pieces = [program[i : i + ARG_CHARS] for i in range(0, len(program), ARG_CHARS)]
    writes = [["sh", "-c", f'printf %s "$0" >> {path}', piece] for piece in pieces]
    argv = " ".join(shlex.quote(str(a)) for a in args)
    start = f"nohup python3 {path} {argv} </dev/null >/tmp/{name}.log 2>&1 &"
    return [["rm", "-f", path], *writes, ["sh", "-c", start]]


def log_bomb(mib: int) -> list[str]:
    """The exec command that writes `mib` MiB of 100-byte lines to the container's own log (its
    init's standard output, which podman keeps)."""
    return ["sh", "-c", f"head -c {mib}M /dev/zero | tr '\\0' x | fold -w 99 > /proc/1/fd/1"]
