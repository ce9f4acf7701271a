"""A watch-driven cache of this server's pods (an informer): one thread lists them once, then follows
the API server's watch from that resourceVersion; `list_containers` reads the cache, never the API.

The backend puts the pods it creates into the cache at once (`put`) and forgets the ones it deletes
(`forget`: later events of that pod uid are ignored), so a reconcile pass right after a create or a
delete sees its effect before the watch reports it. A pod deleted by anyone else (kubectl, a drain)
reaches `on_gone`, so the backend can report it as a failed container. An expired watch (HTTP 410)
relists; a broken connection is retried every `retry_s` while the cache keeps its last state and
`error` says why.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

log = logging.getLogger("elastrain.kubernetes")
Pod = dict[str, Any]
WATCH_SECONDS = 20  # the server ends each watch after this long; the next one resumes where it ended


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (HTTP 410 Gone): list again."""


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))


def _version(pod: Mapping[str, Any]) -> int:
    try:
        return int((pod.get("metadata") or {}).get("resourceVersion", "0"))
    except ValueError:
        return 0


class PodCache:
    """The pods matching `selector` in `namespace`, kept current by a watch thread."""

    def __init__(
        self,
        core: Any,  # kubernetes.client.CoreV1Api
        namespace: str,
        selector: str,
        on_gone: Callable[[Pod], None],
        retry_s: float = 1.0,
    ) -> None:
        self.core = core
        self.namespace = namespace
        self.selector = selector
        self.on_gone = on_gone
        self.retry_s = retry_s
        self.error = ""  # why the last list or watch failed ("" while it works)
        self._pods: dict[str, Pod] = {}  # name -> the pod as the API last showed it
        self._forgotten: set[str] = set()  # uids deleted by the backend: their events are ignored
        self._changed = threading.Condition()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- reading -----------------------------------------------------------------------------------
    def pods(self) -> list[Pod]:
        """The cached pods."""
        with self._changed:
            return list(self._pods.values())

    def get(self, name: str) -> Pod | None:
        """The cached pod `name`."""
        with self._changed:
            return self._pods.get(name)

    def wait_synced(self, timeout: float) -> bool:
        """Wait for the first complete list (False after `timeout`)."""
        return self._synced.wait(timeout)

    def wait_for(self, condition: Callable[[list[Pod]], bool], timeout: float) -> bool:
        """Wait until `condition(pods)` holds, woken by each change (False after `timeout`)."""
        with self._changed:
            return self._changed.wait_for(lambda: condition(list(self._pods.values())), timeout)

    # --- the backend's own changes -----------------------------------------------------------------
    def put(self, pod: Pod) -> None:
        """A pod the backend just created or read (kept unless the cache already has a newer one)."""
        with self._changed:
            current = self._pods.get(_name(pod))
            if current is None or _uid(current) != _uid(pod) or _version(current) <= _version(pod):
                self._pods[_name(pod)] = pod
            self._changed.notify_all()

    def forget(self, pod: Mapping[str, Any]) -> None:
        """A pod the backend is deleting: dropped now, its later events ignored."""
        with self._changed:
            self._forgotten.add(_uid(pod))
            if self._pods.get(_name(pod)) is not None and _uid(self._pods[_name(pod)]) == _uid(pod):
                del self._pods[_name(pod)]
            self._changed.notify_all()

    # --- the thread --------------------------------------------------------------------------------
    def start(self) -> PodCache:
        """Start the watch thread (a daemon: it never keeps the server alive)."""
        self._thread = threading.Thread(target=self._run, name="kubernetes-pod-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the watch thread: it stops at its next event, or when the current watch request ends
        (within `WATCH_SECONDS`; it is a daemon). Closing the response from here instead would block on
        the TLS connection until the reader returns."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=0.5)

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    version = self._relist()
                version = self._follow(version)
                self.error = ""
            except WatchExpired:
                version = ""
            except Exception as exc:  # the API server unreachable, a proxy closing the stream, ...
                if self._stop.is_set():
                    return
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                if self.error != first:
                    log.warning("kubernetes pod watch: %s (retrying every %gs)", first, self.retry_s)
                self.error = first
                version = ""
                self._stop.wait(self.retry_s)

    def _relist(self) -> str:
        """Replace the cache with a fresh list; pods that vanished unseen go to `on_gone`."""
        response = self.core.list_namespaced_pod(
            self.namespace, label_selector=self.selector, _preload_content=False, _request_timeout=(5, 30)
        )
        listing = json.loads(response.data)
        fresh = {_name(p): p for p in listing.get("items") or []}
        with self._changed:
            gone = [p for n, p in self._pods.items() if n not in fresh and _uid(p) not in self._forgotten]
            self._pods = {n: p for n, p in fresh.items() if _uid(p) not in self._forgotten}
            self._changed.notify_all()
        for pod in gone:
            self.on_gone(pod)
        self._synced.set()
        return str((listing.get("metadata") or {}).get("resourceVersion", ""))

    def _follow(self, version: str) -> str:
        """Apply one watch's events from `version`; the version to resume from."""
        response = self.core.list_namespaced_pod(
            self.namespace,
            label_selector=self.selector,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _preload_content=False,
            _request_timeout=(5, WATCH_SECONDS + 15),
        )
        try:
            for event in _events(response):
                version = self._apply(event) or version
                if self._stop.is_set():
                    break
        finally:
            response.release_conn()
        return version

    def _apply(self, event: Mapping[str, Any]) -> str:
        """Apply one watch event; the resourceVersion it brings ("" for none)."""
        kind, pod = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if pod.get("code") == 410:
                raise WatchExpired(pod.get("message", "expired"))
            raise RuntimeError(f"watch error: {pod.get('message', pod)}")
        version = str((pod.get("metadata") or {}).get("resourceVersion", ""))
        if kind == "BOOKMARK":
            return version
        gone = None
        with self._changed:
            if _uid(pod) in self._forgotten:
                if kind == "DELETED":
                    self._forgotten.discard(_uid(pod))
                return version
            current = self._pods.get(_name(pod))
            if kind == "DELETED":
                if current is not None and _uid(current) == _uid(pod):
                    del self._pods[_name(pod)]
                gone = pod
            elif current is None or _uid(current) != _uid(pod) or _version(current) <= _version(pod):
                self._pods[_name(pod)] = pod
            self._changed.notify_all()
        if gone is not None:
            self.on_gone(gone)
        return version


def _events(response: Any) -> Iterator[dict[str, Any]]:
    """The JSON events of a watch response, one per line."""
    pending = b""
    for chunk in response.stream(4096, decode_content=False):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
    if pending.strip():
        yield json.loads(pending)
