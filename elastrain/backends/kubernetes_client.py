"""Reaching a Kubernetes API server with the official client: configuration (a kubeconfig, or the pod's
service account in-cluster), errors turned into one-line `KubernetesError`s saying what to do, and the
start-up check that the server's identity may do what the backend needs (RBAC) in its namespace.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from elastrain.errors import ConfigError

T = TypeVar("T")
REQUEST_TIMEOUT = (5.0, 30.0)  # (connect, read) seconds of every call that is not a watch
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
RBAC_HINT = "grant it the Role of docs/kubernetes/rbac.yaml"
# (resource, subresource, verb): what the backend does in its namespace
REQUIRED_ACCESS: tuple[tuple[str, str, str], ...] = (
    *(("pods", "", verb) for verb in ("get", "list", "watch", "create", "delete", "deletecollection")),
    ("pods", "exec", "create"),
    ("pods", "exec", "get"),  # the Python client execs over a websocket GET (RBAC verb get before 1.30)
    ("pods", "log", "get"),
    *(("configmaps", "", verb) for verb in ("get", "create", "patch", "delete")),
    *(("secrets", "", verb) for verb in ("get", "create", "delete")),
    *(("services", "", verb) for verb in ("get", "create", "delete")),
)


class KubernetesError(ConfigError):
    """A Kubernetes API call failed or is not allowed; the message says what to do. `status`: the
    API's HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class KubeConnection:
    """An API client, the namespace it works in and the kubeconfig it came from (None: in-cluster)."""

    api_client: Any  # kubernetes.client.ApiClient
    namespace: str
    kubeconfig: Path | None

    @property
    def url(self) -> str:
        """The API server's URL."""
        return str(self.api_client.configuration.host)


def connect(kubeconfig: Path | None = None, namespace: str | None = None) -> KubeConnection:
    """A client from `kubeconfig` (default: in-cluster when run in a pod, else $KUBECONFIG or
    ~/.kube/config); the namespace is `namespace`, else the kubeconfig context's, else the pod's own,
    else ``default``."""
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise KubernetesError(
            "the kubernetes backend needs the official Python client: pip install 'elastrain[kubernetes]'"
        ) from None

    if kubeconfig is not None and not Path(kubeconfig).is_file():
        raise KubernetesError(f"kubeconfig {kubeconfig} is not a file; pass --kubeconfig FILE")
    in_cluster = kubeconfig is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    configuration = client.Configuration()
    try:
        if in_cluster:
            config.load_incluster_config(client_configuration=configuration)
            context_ns = IN_CLUSTER_NAMESPACE.read_text().strip() if IN_CLUSTER_NAMESPACE.exists() else ""
        else:
            path = str(kubeconfig) if kubeconfig is not None else os.environ.get("KUBECONFIG") or None
            config.load_kube_config(config_file=path, client_configuration=configuration)
            _contexts, active = config.list_kube_config_contexts(config_file=path)
            context_ns = str(((active or {}).get("context") or {}).get("namespace") or "")
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        where = "the in-cluster service account" if in_cluster else f"kubeconfig {kubeconfig or '(default)'}"
        raise KubernetesError(f"cannot load {where}: {exc}; pass --kubeconfig FILE") from None
    configuration.retries = 1  # an unreachable server answers in seconds, not minutes
    api_client = client.ApiClient(configuration)
    return KubeConnection(api_client, namespace or context_ns or "default", kubeconfig)


def api_error(exc: BaseException, action: str, namespace: str, url: str = "") -> KubernetesError:
    """`exc` from the client while doing `action` (e.g. "create pod x"), as one line saying what to do."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        message = _status_message(exc)
        if exc.status == 403:
            return KubernetesError(
                f"Kubernetes refused to {action} in namespace {namespace}: {message}; {RBAC_HINT}", 403
            )
        if exc.status == 401:
            return KubernetesError(
                f"Kubernetes did not accept the credentials ({message}); check --kubeconfig", 401
            )
        if exc.status == 404 and "namespaces" in message and namespace in message:
            return KubernetesError(
                f"namespace {namespace} does not exist; create it (kubectl create namespace {namespace}) "
                "or pass --namespace",
                404,
            )
        return KubernetesError(
            f"cannot {action} in namespace {namespace}: {message} (HTTP {exc.status})", exc.status
        )
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return KubernetesError(f"cannot reach the Kubernetes API server {url} to {action}: {first}")


def _status_message(exc: Any) -> str:
    """The `message` of the API's Status body, else the HTTP reason."""
    import json

    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    return str(body.get("message") or exc.reason or "no message")


def call(fn: Callable[..., T], *args: Any, action: str, namespace: str, url: str = "", **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` with the request timeout; failures as `KubernetesError` (`api_error`)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return fn(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
    except (ApiException, HTTPError, OSError) as exc:
        raise api_error(exc, action, namespace, url) from None


def missing_access(conn: KubeConnection) -> list[str]:
    """What the backend needs but may not do in its namespace (``verb resource[/sub]``), per the
    API server's SelfSubjectAccessReview; raises `KubernetesError` when it cannot even ask."""
    from kubernetes import client

    authz = client.AuthorizationV1Api(conn.api_client)
    missing = []
    for resource, sub, verb in REQUIRED_ACCESS:
        attributes = {"namespace": conn.namespace, "verb": verb, "resource": resource}
        if sub:
            attributes["subresource"] = sub
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        review = call(
            authz.create_self_subject_access_review,
            body,
            action="check its permissions (SelfSubjectAccessReview)",
            namespace=conn.namespace,
            url=conn.url,
        )
        if not (review.status and review.status.allowed):
            missing.append(f"{verb} {resource}{'/' + sub if sub else ''}")
    return missing


def check_ready(conn: KubeConnection) -> None:
    """Refuse to start (one-line `KubernetesError`) when the API server is unreachable, the namespace
    does not exist, or RBAC denies something the backend needs."""
    from kubernetes import client

    core = client.CoreV1Api(conn.api_client)
    try:
        call(
            core.read_namespace,
            conn.namespace,
            action="read the namespace",
            namespace=conn.namespace,
            url=conn.url,
        )
    except KubernetesError as exc:
        if exc.status != 403:  # a Role cannot grant reading namespaces: that is not required
            raise
    missing = missing_access(conn)
    if missing:
        raise KubernetesError(
            f"the Kubernetes identity of this server may not {', '.join(missing)} in namespace "
            f"{conn.namespace}; {RBAC_HINT}"
        )
