"""Gitea's HTTP API, as far as bootstrapping an environment's Gitea needs it (httpx, async).

Every step is idempotent: an organization or repository that exists is left as it is, so a bootstrap that
is interrupted and run again converges instead of failing or duplicating. The admin's password and API token
never leave this module in messages: errors carry the HTTP status and Gitea's own message only.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from shadow_operator.clients.tls import client_context

TOKEN_NAME = "shadow-operator"
# Scopes of the operator's token: repositories and organizations (create, push), nothing else.
TOKEN_SCOPES = ("write:repository", "write:organization", "read:user")


class GiteaError(Exception):
    def __init__(self, what: str, status: int, message: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {message}")
        self.status = status


class GiteaTimedOut(GiteaError):
    """A call that Gitea did not answer in time (a read, or the whole answer): it accepts but stalls."""


@dataclass(frozen=True)
class Repository:
    owner: str
    name: str
    clone_url: str
    default_branch: str


class Gitea:
    """A client for one Gitea. `auth` is (username, password) for the admin calls, or use `token`."""

    def __init__(
        self,
        base_url: str,
        *,
        username: str,
        password: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Accept": "application/json"}
        auth: httpx.Auth | None = None
        if token:
            headers["Authorization"] = f"token {token}"
        elif password is not None:
            auth = httpx.BasicAuth(username, password)
        self.username = username
        self.base_url = base_url.rstrip("/")
        # Per call in total (httpx's `timeout` is per read): Gitea runs in the tenant's namespace, where a
        # tenant who can exec into its Pod could slow it to a trickle.
        self.call_deadline = 4 * timeout
        self._http = httpx.AsyncClient(
            base_url=self.base_url + "/api/v1",
            headers=headers,
            auth=auth,
            timeout=timeout,
            trust_env=False,
            verify=client_context(),
            transport=transport,
        )

    async def __aenter__(self) -> Gitea:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(
        self, what: str, method: str, path: str, *, ok: tuple[int, ...] = (200, 201, 204), **kw: Any
    ) -> httpx.Response:
        try:
            async with asyncio.timeout(self.call_deadline):
                resp = await self._http.request(method, path, **kw)
        except httpx.TimeoutException as exc:
            raise GiteaTimedOut(what, 0, f"{type(exc).__name__}: {exc}") from None
        except httpx.HTTPError as exc:
            raise GiteaError(what, 0, f"{type(exc).__name__}: {exc}") from None
        except TimeoutError:
            raise GiteaTimedOut(what, 0, f"no whole answer within {self.call_deadline:g}s") from None
        if resp.status_code not in ok:
            try:
                message = str(resp.json().get("message") or resp.text)
            except ValueError:
                message = resp.text
            raise GiteaError(what, resp.status_code, message[:300])
        return resp

    # ------------------------------------------------------------------------------------------ health
    async def healthy(self) -> bool:
        try:
            resp = await self._http.get(self.base_url + "/api/healthz")
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    # ------------------------------------------------------------------------------------------ tokens
    async def create_token(self, name: str = TOKEN_NAME) -> str:
        """A fresh API token for the admin (basic auth). Gitea shows a token only once, so an existing
        token of the same name (from an earlier, interrupted bootstrap) is deleted first."""
        user = self.username
        resp = await self._call("list tokens", "GET", f"/users/{user}/tokens", params={"limit": 50})
        for token in resp.json():
            if token.get("name") == name:
                await self._call(
                    "delete token", "DELETE", f"/users/{user}/tokens/{token['id']}", ok=(204, 404)
                )
        resp = await self._call(
            "create token", "POST", f"/users/{user}/tokens", json={"name": name, "scopes": list(TOKEN_SCOPES)}
        )
        return str(resp.json()["sha1"])

    async def whoami(self) -> str:
        resp = await self._call("who am I", "GET", "/user")
        return str(resp.json()["login"])

    # ------------------------------------------------------------------------------------ organizations
    async def ensure_org(self, org: str) -> bool:
        """Create the organization if missing; True when it was created."""
        resp = await self._call("get organization", "GET", f"/orgs/{org}", ok=(200, 404))
        if resp.status_code == 200:
            return False
        resp = await self._call(
            "create organization",
            "POST",
            "/orgs",
            json={"username": org, "visibility": "public", "repo_admin_change_team_access": True},
            ok=(201, 422),
        )
        return resp.status_code == 201

    # ------------------------------------------------------------------------------------- repositories
    async def get_repo(self, org: str, name: str) -> Repository | None:
        resp = await self._call("get repository", "GET", f"/repos/{org}/{name}", ok=(200, 404))
        if resp.status_code == 404:
            return None
        return _repository(resp.json())

    async def ensure_repo(self, org: str, name: str) -> tuple[Repository, bool]:
        """The public repository `org/name`, created empty if missing; and whether it was created."""
        existing = await self.get_repo(org, name)
        if existing is not None:
            return existing, False
        resp = await self._call(
            "create repository",
            "POST",
            f"/orgs/{org}/repos",
            json={"name": name, "private": False, "auto_init": False, "default_branch": "main"},
            ok=(201, 409),
        )
        if resp.status_code == 409:  # created concurrently
            repo = await self.get_repo(org, name)
            assert repo is not None
            return repo, False
        return _repository(resp.json()), True

    async def set_default_branch(self, org: str, name: str, branch: str) -> None:
        await self._call(
            "set default branch", "PATCH", f"/repos/{org}/{name}", json={"default_branch": branch}
        )

    async def branch_commit(self, org: str, name: str, branch: str) -> str | None:
        resp = await self._call("get branch", "GET", f"/repos/{org}/{name}/branches/{branch}", ok=(200, 404))
        if resp.status_code == 404:
            return None
        return str(resp.json()["commit"]["id"])

    async def list_repos(self, org: str) -> list[str]:
        resp = await self._call("list repositories", "GET", f"/orgs/{org}/repos", params={"limit": 50})
        return sorted(str(r["name"]) for r in resp.json())

    async def list_orgs(self) -> list[str]:
        resp = await self._call("list organizations", "GET", "/admin/orgs", params={"limit": 50})
        return sorted(str(o["username"]) for o in resp.json())


def _repository(data: dict[str, Any]) -> Repository:
    return Repository(
        owner=str(data["owner"]["login"]),
        name=str(data["name"]),
        clone_url=str(data["clone_url"]),
        default_branch=str(data.get("default_branch") or "main"),
    )
