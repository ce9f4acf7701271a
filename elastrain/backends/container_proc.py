"""A local container's init process: holds the container's loopback address until told to stop.

``python -m elastrain.backends.container_proc --root DIR --address 127.x.y.z`` binds a listening TCP
socket on the address (so the address is taken while the container lives), writes ``DIR/ready``
(``pid port``), answers each connection with one status line, and exits on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path


def serve(root: Path, address: str) -> int:
    """Bind, announce readiness, then wait for connections or a stop signal."""
    stop = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, 0))
    server.listen(16)
    server.setblocking(False)
    port = server.getsockname()[1]
    tmp = root / ".ready.tmp"
    tmp.write_text(f"{os.getpid()} {port}\n")
    os.replace(tmp, root / "ready")
    print(f"container {root.name} up at {address}:{port} (pid {os.getpid()})", flush=True)
    started = time.time()
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ)
    while not stop:
        for _key, _mask in selector.select(timeout=0.5):
            try:
                conn, _peer = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(f"ok {root.name} {address} up {time.time() - started:.0f}s\n".encode())
    print(f"container {root.name} stopping", flush=True)
    try:
        (root / "ready").unlink()
    except FileNotFoundError:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="elastrain-container")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--address", required=True)
    args = parser.parse_args(argv)
    return serve(args.root, args.address)


if __name__ == "__main__":
    sys.exit(main())
