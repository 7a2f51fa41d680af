"""A small JSON-in, JSON-out Kubernetes client on aiohttp.

Controllers work with plain dicts (the same shapes kopf hands them), so the generated model classes of
Kubernetes client libraries are not used: every call returns the decoded JSON body.
"""

from __future__ import annotations

import builtins
import json
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import aiohttp
import kopf

from shadow_operator import __version__
from shadow_operator.api.kinds import resource_path

Body = dict[str, Any]
USER_AGENT = f"shadow-operator/{__version__}"

__all__ = ["USER_AGENT", "ApiError", "Body", "Kube", "resource_path"]


class ApiError(Exception):
    """A non-2xx answer from the API server; `status` is the HTTP code, `reason` the Status reason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def invalid(self) -> bool:
        """The request body was refused on validation (it will not pass on retry)."""
        return self.status in (400, 422)

    @property
    def runtime_class_missing(self) -> bool:
        """A Pod naming a RuntimeClass the cluster does not have (the RuntimeClass admission plugin's 403)."""
        return self.status == 403 and "pod rejected: RuntimeClass" in self.message

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"


class Kube:
    """Async JSON client. Create with `await Kube.connect()`; close with `await kube.close()`.

    Credentials come from kopf's own login (in-cluster service account, else the kubeconfig), so the operator
    needs no Kubernetes client library; requests go through one aiohttp session that does not trust the
    environment (no request re-reads ~/.netrc or the proxy variables) and bodies stay plain JSON.
    """

    def __init__(self, session: aiohttp.ClientSession, server: str) -> None:
        self._session = session
        self._server = server.rstrip("/")
        self._auth: dict[str, str] = {}
        self.requests: Counter[str] = Counter()

    @classmethod
    async def connect(cls, *, max_connections: int = 32) -> Kube:
        info = _login()
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_connections, ssl=info.as_ssl_context()),
            trust_env=False,
            timeout=aiohttp.ClientTimeout(total=60, connect=10),
            read_bufsize=2**21,
        )
        kube = cls(session, info.server)
        kube._auth = dict(info.as_http_headers())
        return kube

    def _relogin(self) -> None:
        """Service account tokens rotate: read the credentials again (after a 401)."""
        self._auth = dict(_login().as_http_headers())

    async def close(self) -> None:
        await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Body:
        self.requests[method] += 1
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        for attempt in (1, 2):
            headers = {"Accept": "application/json", "Content-Type": content_type, "User-Agent": USER_AGENT}
            headers.update(self._auth)
            async with self._session.request(
                method, self._server + path, params=query or None, data=data, headers=headers
            ) as response:
                raw = await response.read()
                status = response.status
                reason = response.reason or ""
            if status == 401 and attempt == 1:
                self._relogin()
                continue
            break
        if not 200 <= status <= 299:
            raise _api_error(status, reason, raw.decode(errors="replace"))
        decoded: Body = json.loads(raw) if raw else {}
        return decoded

    async def get(self, path: str) -> Body | None:
        try:
            return await self.request("GET", path)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def list(
        self, path: str, *, labels: str | None = None, fields: str | None = None
    ) -> builtins.list[Body]:
        query = {}
        if labels:
            query["labelSelector"] = labels
        if fields:
            query["fieldSelector"] = fields
        result = await self.request("GET", path, query=query)
        items: builtins.list[Body] = result.get("items", [])
        return items

    async def list_with_version(
        self, path: str, *, labels: str | None = None
    ) -> tuple[builtins.list[Body], str]:
        """(items, the list's resourceVersion): the starting point of a watch."""
        result = await self.request("GET", path, query={"labelSelector": labels} if labels else None)
        return result.get("items", []), str(result.get("metadata", {}).get("resourceVersion") or "")

    async def watch(
        self, path: str, *, resource_version: str, labels: str | None = None, timeout_seconds: int = 300
    ) -> AsyncIterator[tuple[str, Body]]:
        """(type, object) of each event of one watch request, which the server ends after timeout_seconds.

        An expired resourceVersion arrives as an ERROR event with a Status (code 410): the caller lists again.
        """
        query = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
        }
        if labels:
            query["labelSelector"] = labels
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **self._auth}
        self.requests["WATCH"] += 1
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=timeout_seconds + 30)
        async with self._session.get(
            self._server + path, params=query, headers=headers, timeout=timeout
        ) as response:
            if response.status == 401:
                self._relogin()
            if response.status != 200:
                raise _api_error(response.status, response.reason or "", await response.text())
            async for line in response.content:
                if line.strip():
                    event = json.loads(line)
                    yield str(event["type"]), event["object"]

    async def create(self, path: str, body: Mapping[str, Any]) -> Body:
        return await self.request("POST", path, body=body)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Body:
        return await self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    async def json_patch(self, path: str, ops: Sequence[Mapping[str, Any]]) -> Body:
        return await self.request("PATCH", path, body=ops, content_type="application/json-patch+json")

    async def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, force: bool = True
    ) -> Body:
        """Server-side apply (the body is JSON, which is YAML)."""
        query = {"fieldManager": field_manager, "force": "true" if force else "false"}
        return await self.request(
            "PATCH", path, body=body, query=query, content_type="application/apply-patch+yaml"
        )

    async def replace(self, path: str, body: Mapping[str, Any]) -> Body:
        return await self.request("PUT", path, body=body)

    async def delete(
        self,
        path: str,
        *,
        propagation: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
        grace_seconds: int | None = None,
    ) -> bool:
        """Delete; False when it was already gone. `uid`/`resource_version` are preconditions; `grace_seconds`
        replaces the object's own grace period (a Pod's terminationGracePeriodSeconds)."""
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation:
            options["propagationPolicy"] = propagation
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            options["preconditions"] = preconditions
        try:
            await self.request("DELETE", path, body=options)
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True


def _login() -> kopf.ConnectionInfo:
    settings = kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise RuntimeError("no Kubernetes credentials: not in a pod, and no kubeconfig (set KUBECONFIG)")
    return info


def _api_error(status: int, reason: str, body: Any) -> ApiError:
    message = str(body or reason)
    try:
        decoded = json.loads(body) if isinstance(body, str | bytes) else None
    except ValueError:
        decoded = None
    if isinstance(decoded, dict):
        reason = decoded.get("reason") or reason
        message = decoded.get("message") or message
    return ApiError(status, str(reason), str(message))
