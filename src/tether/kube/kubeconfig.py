"""Where the Kubernetes API server is and how to authenticate to it: kubeconfig files or in-cluster.

Supports the kubeconfig subset agentk needs (kas.md §8.1 "standard kubeconfig flags"): the current
context's cluster (``server``, ``certificate-authority`` / ``-data``, ``insecure-skip-tls-verify``) and
user (``token``, ``tokenFile``, ``client-certificate`` / ``-data`` + ``client-key`` / ``-data``). Exec and
auth-provider plugins are rejected with a clear error. Several files in ``KUBECONFIG`` (``:``-separated)
are merged the way kubectl does: the first file that defines a name or ``current-context`` wins.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "SERVICE_ACCOUNT_DIR",
    "KubeConfigError",
    "KubeCredentials",
    "load_credentials",
    "load_in_cluster",
    "load_kubeconfig",
]

#: Mounted by the kubelet into every pod that automounts its ServiceAccount token.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeConfigError(ValueError):
    """The credentials could not be loaded: missing file, missing entry, unsupported auth or bad data."""


@dataclass(frozen=True)
class KubeCredentials:
    """Everything needed to reach one API server.

    Attributes:
        server: base URL, e.g. ``https://10.0.0.1:443`` (no trailing slash).
        ca_pem: PEM bytes of the CA(s) that sign the serving certificate; None uses the system store.
        insecure_skip_tls_verify: disable server certificate verification (kubeconfig flag).
        token: static bearer token, if any.
        token_file: file holding a bearer token that may be rotated (re-read by the client).
        client_cert_pem: PEM bytes of a client certificate (with ``client_key_pem``), if any.
        client_key_pem: PEM bytes of the matching private key.
        namespace: the context's namespace (``default`` when unset).
    """

    server: str
    ca_pem: bytes | None = None
    insecure_skip_tls_verify: bool = False
    token: str | None = None
    token_file: Path | None = None
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    namespace: str = "default"

    def ssl_context(self) -> ssl.SSLContext | None:
        """Build the TLS context for an ``https`` server; None for plain ``http``.

        Raises:
            KubeConfigError: the CA or client certificate data cannot be loaded.
        """
        if not self.server.startswith("https://"):
            return None
        try:
            context = ssl.create_default_context(
                cadata=self.ca_pem.decode("ascii") if self.ca_pem is not None else None
            )
            if self.insecure_skip_tls_verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if self.client_cert_pem is not None and self.client_key_pem is not None:
                _load_client_pair(context, self.client_cert_pem, self.client_key_pem)
        except (ssl.SSLError, ValueError, UnicodeDecodeError) as exc:
            raise KubeConfigError(f"invalid TLS material for {self.server}: {exc}") from exc
        return context


def _load_client_pair(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    # ssl can only load a certificate chain from files: write both to a private directory, load, delete.
    with tempfile.TemporaryDirectory(prefix="tether-kube-") as directory:
        cert_path = Path(directory, "client.crt")
        key_path = Path(directory, "client.key")
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            path.touch(mode=0o600)
            path.write_bytes(data)
        context.load_cert_chain(str(cert_path), str(key_path))


def load_credentials(kubeconfig: str | None) -> KubeCredentials:
    """Load credentials from ``kubeconfig`` if given, else from the in-cluster service account.

    Args:
        kubeconfig: one path or several ``:``-separated paths (the ``KUBECONFIG`` convention), or None.

    Raises:
        KubeConfigError: as :func:`load_kubeconfig` / :func:`load_in_cluster`.
    """
    if kubeconfig:
        return load_kubeconfig([Path(p) for p in kubeconfig.split(os.pathsep) if p])
    return load_in_cluster()


def load_in_cluster(
    env: Mapping[str, str] | None = None, service_account_dir: Path = SERVICE_ACCOUNT_DIR
) -> KubeCredentials:
    """Credentials of the pod's ServiceAccount (``KUBERNETES_SERVICE_HOST``/``_PORT``, token, ``ca.crt``).

    The token is referenced by path, because the kubelet rotates it in place.

    Raises:
        KubeConfigError: not running in a pod (variables or files missing).
    """
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeConfigError(
            "no kubeconfig given and not running in a cluster (KUBERNETES_SERVICE_HOST/PORT unset); "
            "pass --kubeconfig or set KUBECONFIG"
        )
    token_file = service_account_dir / "token"
    ca_file = service_account_dir / "ca.crt"
    if not token_file.is_file():
        raise KubeConfigError(f"in-cluster service account token {token_file} not found")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    namespace_file = service_account_dir / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else "default"
    return KubeCredentials(
        server=f"https://{host}:{port}",
        ca_pem=_read(ca_file) if ca_file.is_file() else None,
        token_file=token_file,
        namespace=namespace or "default",
    )


def load_kubeconfig(paths: list[Path], context: str | None = None) -> KubeCredentials:
    """Credentials of ``context`` (default: ``current-context``) from one or several kubeconfig files.

    Relative file references are resolved against the directory of the file that holds them.

    Raises:
        KubeConfigError: a file is missing or not YAML, the context/cluster/user is missing, or the user
            needs an unsupported mechanism (exec, auth-provider, basic auth).
    """
    if not paths:
        raise KubeConfigError("empty kubeconfig path")
    merged = _merge([_read_kubeconfig(p) for p in paths])
    name = context or merged.current_context
    if not name:
        raise KubeConfigError(f"kubeconfig {_names(paths)} has no current-context")
    ctx, _ = _lookup(merged.contexts, name, "context", paths)
    cluster, cluster_base = _lookup(merged.clusters, str(ctx.get("cluster", "")), "cluster", paths)
    user: dict[str, Any] = {}
    user_base = cluster_base
    if ctx.get("user"):
        user, user_base = _lookup(merged.users, str(ctx["user"]), "user", paths)
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise KubeConfigError(f"cluster {ctx.get('cluster')!r} in {_names(paths)} has no server")
    for unsupported in ("exec", "auth-provider", "username"):
        if user.get(unsupported):
            raise KubeConfigError(
                f"kubeconfig user {ctx.get('user')!r}: {unsupported!r} authentication is not supported"
            )
    token_file = user.get("tokenFile")
    return KubeCredentials(
        server=server,
        ca_pem=_material(cluster, "certificate-authority", cluster_base),
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
        token=str(user["token"]) if user.get("token") else None,
        token_file=_resolve(str(token_file), user_base) if token_file else None,
        client_cert_pem=_material(user, "client-certificate", user_base),
        client_key_pem=_material(user, "client-key", user_base),
        namespace=str(ctx.get("namespace") or "default"),
    )


@dataclass
class _Merged:
    current_context: str | None
    contexts: dict[str, tuple[dict[str, Any], Path]]
    clusters: dict[str, tuple[dict[str, Any], Path]]
    users: dict[str, tuple[dict[str, Any], Path]]


def _read_kubeconfig(path: Path) -> tuple[dict[str, Any], Path]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise KubeConfigError(f"cannot read kubeconfig {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise KubeConfigError(f"kubeconfig {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise KubeConfigError(f"kubeconfig {path} is not a mapping")
    return data, path.resolve().parent


def _merge(files: list[tuple[dict[str, Any], Path]]) -> _Merged:
    merged = _Merged(current_context=None, contexts={}, clusters={}, users={})
    for data, base in files:
        merged.current_context = merged.current_context or data.get("current-context") or None
        for key, target in (("contexts", merged.contexts), ("clusters", merged.clusters), ("users", merged.users)):
            inner = key[:-1]  # each entry is {name: ..., context|cluster|user: {...}}
            for entry in data.get(key) or []:
                if isinstance(entry, dict) and entry.get("name") and entry["name"] not in target:
                    target[str(entry["name"])] = (dict(entry.get(inner) or {}), base)
    return merged


def _lookup(
    table: dict[str, tuple[dict[str, Any], Path]], name: str, kind: str, paths: list[Path]
) -> tuple[dict[str, Any], Path]:
    try:
        return table[name]
    except KeyError:
        raise KubeConfigError(f"{kind} {name!r} not found in kubeconfig {_names(paths)}") from None


def _material(section: dict[str, Any], key: str, base: Path) -> bytes | None:
    # "<key>-data" is base64 inline PEM, "<key>" is a file path; inline data wins (as in client-go).
    inline = section.get(f"{key}-data")
    if inline:
        try:
            return base64.b64decode(str(inline), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise KubeConfigError(f"kubeconfig {key}-data is not valid base64") from exc
    path = section.get(key)
    return _read(_resolve(str(path), base)) if path else None


def _resolve(path: str, base: Path) -> Path:
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else base / candidate


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise KubeConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _names(paths: list[Path]) -> str:
    return os.pathsep.join(str(p) for p in paths)
