"""A thin asyncio client for the Kubernetes REST API on aiohttp: GET JSON, paginated lists, /version.

The seed of the informer layer: no typed models, objects stay plain JSON dicts. Errors the API server
reports come back as :class:`KubeApiError` built from the ``Status`` body; transport failures as
:class:`KubeConnectionError`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
from multidict import CIMultiDict

from tether.kube.kubeconfig import KubeCredentials
from tether.tool import tracing

__all__ = ["KubeApiError", "KubeClient", "KubeConnectionError", "KubeError", "ObjectList", "ServerVersion"]

#: A rotated ServiceAccount token is picked up within this many seconds (client-go re-reads every minute).
TOKEN_REREAD_S = 60.0


class KubeError(Exception):
    """Base class of the errors :class:`KubeClient` raises."""


class KubeApiError(KubeError):
    """The API server answered with a non-2xx status.

    Attributes:
        status: HTTP status code, e.g. 404.
        reason: ``Status.reason`` (e.g. ``NotFound``, ``Forbidden``), or the HTTP reason phrase when the
            body is not a ``Status``.
        message: ``Status.message`` (human readable), or the start of the body.
    """

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"kubernetes API error {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class KubeConnectionError(KubeError):
    """The API server could not be reached or the response could not be read (network, TLS, timeout)."""


@dataclass(frozen=True)
class ObjectList:
    """All items of a (possibly paginated) list.

    Attributes:
        items: the objects, as decoded JSON.
        resource_version: ``metadata.resourceVersion`` of the first page (a watch can start from it).
        pages: how many requests the list took.
    """

    items: list[dict[str, Any]]
    resource_version: str
    pages: int


@dataclass(frozen=True)
class ServerVersion:
    """The API server's ``/version`` (fields as in ``entity.KubernetesVersion``)."""

    major: str
    minor: str
    git_version: str
    platform: str


@dataclass
class _Token:
    value: str | None = None
    read_at: float = field(default=-TOKEN_REREAD_S)


class KubeClient:
    """Authenticated JSON access to one API server.

    Create and use it inside a running event loop; call :meth:`close` when done. Safe to share between
    tasks.

    Args:
        credentials: server URL, TLS material and bearer token / client certificate.
        timeout_s: limit in seconds for one whole request (connect + response).
    """

    def __init__(self, credentials: KubeCredentials, *, timeout_s: float = 30.0) -> None:
        self._credentials = credentials
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._watch_session: aiohttp.ClientSession | None = None
        self._token = _Token(value=credentials.token)
        self._owner: KubeClient | None = None
        self._extra_headers: tuple[tuple[str, str], ...] = ()

    def with_headers(self, headers: Sequence[tuple[str, str]]) -> KubeClient:
        """A client sending ``headers`` on every request, sharing this client's connections and credentials.

        Used to act as another identity (``Impersonate-*`` headers, kas.md §4.5). Closing the returned client
        does nothing; closing this one closes both.

        Args:
            headers: (name, value) pairs; a name may repeat (e.g. one ``Impersonate-Group`` per group).
        """
        view = KubeClient(self._credentials, timeout_s=self._timeout.total or 30.0)
        view._owner = self._owner or self
        view._extra_headers = (*self._extra_headers, *headers)
        return view

    def _headers(self, accept: str) -> CIMultiDict[str]:
        headers: CIMultiDict[str] = CIMultiDict(self._extra_headers)
        headers["Accept"] = accept
        token = self._bearer_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    @property
    def credentials(self) -> KubeCredentials:
        """The credentials this client uses."""
        return self._credentials

    async def get_json(
        self, path: str, params: Mapping[str, str] | None = None, *, accept: str = "application/json"
    ) -> dict[str, Any]:
        """GET ``path`` (e.g. ``/api/v1/pods``) and return the decoded JSON object.

        Args:
            path: URL path on the API server.
            params: query parameters.
            accept: the ``Accept`` header (e.g. an aggregated-discovery media type list).

        Raises:
            KubeApiError: non-2xx answer (from the ``Status`` body).
            KubeConnectionError: network/TLS failure, timeout, or a body that is not a JSON object.
        """
        session = self._ensure_session()
        headers = self._headers(accept)
        url = self._credentials.server + path
        tracer = tracing.TRACER
        span = (
            None if tracer is None else tracer.start_child("HTTP GET", {"http.request.method": "GET", "url.full": url})
        )
        if span is not None:  # within a traced call: the API server gets this span as its parent (issue 25 item 3)
            for key, value in span.carrier():
                headers[key] = value
        try:
            async with session.get(url, params=dict(params or {}), headers=headers) as response:
                body = await response.read()
                if span is not None:
                    span.http_status(response.status, server=False)
                if response.status >= 300:
                    raise _api_error(response.status, response.reason or "", body)
        except aiohttp.ClientError as exc:
            if span is not None:
                span.fail(repr(exc))
            raise KubeConnectionError(f"GET {url}: {exc}") from exc
        except TimeoutError as exc:
            if span is not None:
                span.fail("timed out")
            raise KubeConnectionError(f"GET {url}: timed out after {self._timeout.total} s") from exc
        finally:
            if span is not None:
                span.end()
        try:
            decoded = msgspec.json.decode(body)  # about twice as fast as json.loads on large lists
        except msgspec.DecodeError as exc:
            raise KubeConnectionError(f"GET {url}: response is not JSON") from exc
        if not isinstance(decoded, dict):
            raise KubeConnectionError(f"GET {url}: response is not a JSON object")
        return decoded

    async def list_pages(
        self, path: str, params: Mapping[str, str] | None = None, *, limit: int = 500
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield each page of a list, following ``metadata.continue`` with ``limit`` items per request.

        Raises:
            KubeApiError: as :meth:`get_json`; 410 ``Expired`` when a continue token outlived etcd's
                compaction (the caller restarts the list).
            KubeConnectionError: as :meth:`get_json`.
        """
        query = dict(params or {})
        query["limit"] = str(limit)
        while True:
            page = await self.get_json(path, query)
            yield page
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return
            query["continue"] = str(token)

    async def list_all(self, path: str, params: Mapping[str, str] | None = None, *, limit: int = 500) -> ObjectList:
        """Collect every item of a list collection (e.g. ``/api/v1/pods``), ``limit`` items per request.

        Raises:
            KubeApiError, KubeConnectionError: as :meth:`list_pages`.
        """
        items: list[dict[str, Any]] = []
        resource_version = ""
        pages = 0
        async for page in self.list_pages(path, params, limit=limit):
            if pages == 0:
                resource_version = str((page.get("metadata") or {}).get("resourceVersion", ""))
            pages += 1
            items.extend(page.get("items") or [])
        return ObjectList(items=items, resource_version=resource_version, pages=pages)

    async def watch(
        self, path: str, params: Mapping[str, str] | None = None, *, read_timeout_s: float = 600.0
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream the events of a watch (``GET path?watch=1&...``) as decoded ``{"type", "object"}`` dicts.

        The caller sets ``resourceVersion``, ``allowWatchBookmarks``, ``timeoutSeconds`` and selectors in
        ``params``. The iterator ends when the server closes the stream (e.g. after ``timeoutSeconds``).
        Watches use their own connection pool without a connection limit (each watch holds one HTTP/1.1
        connection) and without a total timeout.

        Args:
            path: collection path, e.g. ``/api/v1/namespaces/x/pods``.
            params: query parameters (``watch=1`` is added).
            read_timeout_s: seconds without any bytes after which the stream counts as dead.

        Raises:
            KubeApiError: non-2xx answer at the start of the watch (e.g. 410 ``Expired``).
            KubeConnectionError: network/TLS failure, read timeout, or a line that is not a JSON object.
        """
        session = self._ensure_watch_session()
        headers = self._headers("application/json")
        url = self._credentials.server + path
        query = dict(params or {})
        query["watch"] = "1"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout.total, sock_read=read_timeout_s)
        try:
            async with session.get(url, params=query, headers=headers, timeout=timeout) as response:
                if response.status >= 300:
                    raise _api_error(response.status, response.reason or "", await response.read())
                pending: list[bytes] = []  # pieces of an incomplete line
                async for chunk in response.content.iter_any():
                    lines = chunk.split(b"\n")
                    if len(lines) == 1:
                        pending.append(chunk)
                        continue
                    pending.append(lines[0])
                    lines[0] = b"".join(pending)
                    pending = [lines.pop()]
                    for line in lines:
                        if line.strip():
                            yield _decode_event(url, line)
                rest = b"".join(pending)
                if rest.strip():
                    yield _decode_event(url, rest)
        except aiohttp.ClientError as exc:
            raise KubeConnectionError(f"watch {url}: {exc}") from exc
        except TimeoutError as exc:
            raise KubeConnectionError(f"watch {url}: no data for {read_timeout_s} s") from exc

    async def server_version(self) -> ServerVersion:
        """The API server's version from ``/version``.

        Raises:
            KubeApiError, KubeConnectionError: as :meth:`get_json`.
        """
        data = await self.get_json("/version")
        return ServerVersion(
            major=str(data.get("major", "")),
            minor=str(data.get("minor", "")),
            git_version=str(data.get("gitVersion", "")),
            platform=str(data.get("platform", "")),
        )

    async def send_json(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        *,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """Send a write (``POST``, ``PUT``, ``PATCH``, ``DELETE``) with a JSON body; return the decoded answer.

        Server-side apply is ``PATCH`` with ``content_type="application/apply-patch+yaml"`` (JSON is YAML) and
        ``params={"fieldManager": ..., "force": "true"}``.

        Raises:
            KubeApiError: non-2xx answer (from the ``Status`` body), e.g. 404, 409, 422 with the reason.
            KubeConnectionError: network/TLS failure or timeout.
        """
        session = self._ensure_session()
        headers = {"Accept": "application/json", "Content-Type": content_type}
        token = self._bearer_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = self._credentials.server + path
        data = None if body is None else json.dumps(body).encode()
        try:
            async with session.request(method, url, params=dict(params or {}), headers=headers, data=data) as response:
                answer = await response.read()
                if response.status >= 300:
                    raise _api_error(response.status, response.reason or "", answer)
        except aiohttp.ClientError as exc:
            raise KubeConnectionError(f"{method} {url}: {exc}") from exc
        except TimeoutError as exc:
            raise KubeConnectionError(f"{method} {url}: timed out after {self._timeout.total} s") from exc
        try:
            decoded = json.loads(answer) if answer else {}
        except ValueError as exc:
            raise KubeConnectionError(f"{method} {url}: response is not JSON") from exc
        return decoded if isinstance(decoded, dict) else {}

    async def close(self) -> None:
        """Close the connection pool; the client must not be used afterwards (no-op for :meth:`with_headers`)."""
        if self._owner is not None:
            return
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._watch_session is not None:
            await self._watch_session.close()
            self._watch_session = None

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._owner is not None:
            return self._owner._ensure_session()
        if self._session is None:
            ssl_context = self._credentials.ssl_context()
            connector = aiohttp.TCPConnector(ssl=ssl_context if ssl_context is not None else False)
            # Authenticated by credentials on every request: a cookie the API server relays is not kept.
            jar = aiohttp.DummyCookieJar()
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, cookie_jar=jar)
        return self._session

    def _ensure_watch_session(self) -> aiohttp.ClientSession:
        if self._owner is not None:
            return self._owner._ensure_watch_session()
        if self._watch_session is None:
            ssl_context = self._credentials.ssl_context()
            connector = aiohttp.TCPConnector(ssl=ssl_context if ssl_context is not None else False, limit=0)
            self._watch_session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
        return self._watch_session

    def _bearer_token(self) -> str | None:
        if self._owner is not None:
            return self._owner._bearer_token()
        path = self._credentials.token_file
        if path is None:
            return self._token.value
        now = time.monotonic()
        if now - self._token.read_at >= TOKEN_REREAD_S:
            try:
                self._token.value = path.read_text().strip()
            except OSError as exc:
                # Keep the previous token: the kubelet replaces the file atomically, a failure is transient.
                if self._token.value is None:
                    raise KubeConnectionError(f"cannot read token file {path}: {exc.strerror or exc}") from exc
            self._token.read_at = now
        return self._token.value


def _decode_event(url: str, line: bytes) -> dict[str, Any]:
    try:
        event = msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise KubeConnectionError(f"watch {url}: event is not JSON") from exc
    if not isinstance(event, dict):
        raise KubeConnectionError(f"watch {url}: event is not a JSON object")
    return event


def _api_error(status: int, http_reason: str, body: bytes) -> KubeApiError:
    try:
        decoded = json.loads(body)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and decoded.get("kind") == "Status":
        return KubeApiError(status, str(decoded.get("reason") or http_reason), str(decoded.get("message", "")))
    return KubeApiError(status, http_reason, body[:200].decode("utf-8", "replace"))
