"""The sandbox runtime's native API (sandbox-runtime `/v1/...`), as the operator uses it: exec and baseline."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx


class RuntimeUnavailable(Exception):
    """The runtime could not be reached or refused a request."""


class DownloadTooLarge(Exception):
    """A file from the workspace is larger than the operator accepts."""

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(f"{path} is larger than {limit} bytes, the most the operator accepts")
        self.limit = limit


class RuntimeRefused(RuntimeUnavailable):
    """The runtime answered with an error status."""

    def __init__(self, status: int, message: str, detail: str) -> None:
        super().__init__(f"{message}: {detail}")
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def output(self) -> str:
        return (self.stdout + ("\n" if self.stdout and self.stderr else "") + self.stderr).strip()


class Runtime:
    def __init__(self, base_url: str, token: str | None, *, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, trust_env=False
        )
        self._journal_flag = True

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, *, timeout: float | None = None, **kw: Any) -> Any:
        try:
            resp = await self._http.request(
                method, path, timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT, **kw
            )
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"runtime unreachable: {type(exc).__name__}: {exc}") from None
        if resp.status_code >= 400:
            raise RuntimeRefused(
                resp.status_code, f"runtime answered {resp.status_code} to {method} {path}", resp.text[:300]
            )
        return resp.json() if resp.content else None

    async def healthy(self) -> bool:
        try:
            await self._request("GET", "/v1/health", timeout=5.0)
        except RuntimeUnavailable:
            return False
        return True

    async def idle_seconds(self) -> float:
        """Seconds since the runtime's last API request ended (0 while one is in flight)."""
        data = await self._request("GET", "/v1/health", timeout=10.0)
        return float(data.get("idle_seconds") or 0)

    async def sh(
        self,
        script: str,
        *,
        env: dict[str, str] | None = None,
        cwd: str = "",
        timeout: float = 600.0,
        tag: str,
    ) -> ExecResult:
        """Run a shell program to completion (`sh -c`), its inputs in `env`."""
        body = {
            "command": script,
            "env": env or {},
            "cwd": cwd,
            "timeout_seconds": timeout,
            "tag": tag,
        }
        if self._journal_flag:
            # The operator's plumbing is not the agent's work: keep it out of the journal and HANDOFF.md.
            body["journal"] = False
        try:
            data = await self._request("POST", "/v1/exec", json=body, timeout=timeout + 30.0)
        except RuntimeRefused as exc:
            # A workspace image with an older runtime (a template pinned to it) refuses the field: run the
            # command anyway, journaled, rather than never copying anything in.
            if not (exc.status == 422 and "journal" in exc.detail and self._journal_flag):
                raise
            self._journal_flag = False
            body.pop("journal")
            data = await self._request("POST", "/v1/exec", json=body, timeout=timeout + 30.0)
        return ExecResult(
            exit_code=int(data["exit_code"]),
            stdout=str(data["stdout"]),
            stderr=str(data["stderr"]),
            timed_out=bool(data["timed_out"]),
        )

    async def capture_baseline(self, exclude: list[str] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self._request(
            "POST", "/v1/baseline", json={"exclude": exclude or []}, timeout=600.0
        )
        return result

    async def has_baseline(self) -> bool:
        try:
            await self._request("GET", "/v1/baseline", timeout=30.0)
        except RuntimeRefused as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def flush(self) -> None:
        """Write the workspace's dirty pages to its volume (`sync`), e.g. before the volume is snapshotted."""
        result = await self.sh("sync", timeout=120.0, tag="shadow-operator: flush before snapshot")
        if not result.ok:
            raise RuntimeRefused(500, "sync failed in the workspace", result.output[:300])

    async def download(self, path: str, dest: Path, *, limit: int, timeout: float = 600.0) -> int:
        """Stream the workspace file `path` into `dest`, refusing it past `limit` bytes (the workspace decides
        what the file is: never trust its size). Returns the number of bytes written."""
        written = 0
        try:
            async with self._http.stream("GET", f"/v1/files/{path}", timeout=timeout) as resp:
                if resp.status_code >= 400:
                    head = b""
                    async for chunk in resp.aiter_raw():
                        head += chunk
                        if len(head) >= 300:
                            break
                    raise RuntimeRefused(
                        resp.status_code, f"download of {path} refused", head[:300].decode(errors="replace")
                    )
                with dest.open("wb") as out:
                    async for chunk in resp.aiter_raw():
                        written += len(chunk)
                        if written > limit:
                            raise DownloadTooLarge(path, limit)
                        out.write(chunk)
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"download interrupted: {type(exc).__name__}: {exc}") from None
        return written

    async def delete(self, path: str) -> None:
        """Remove a file or directory tree of the workspace (gone already is fine)."""
        try:
            await self._request("DELETE", f"/v1/files/{path}", params={"recursive": "true"}, timeout=120.0)
        except RuntimeRefused as exc:
            if exc.status != 404:
                raise

    async def copy_tree_to(self, target: Runtime, path: str = "", *, timeout: float = 600.0) -> int:
        """Stream the directory `path` of this workspace as tar.gz into the same directory of `target`.

        The bytes pass through without being held: the export's body is the import's request body. Returns
        the number of bytes streamed.
        """
        streamed = 0
        try:
            async with self._http.stream(
                # Uncompressed (gzip level 0): inside the cluster, compressing costs both runtimes more CPU than
                # it saves on the wire (a mixed 116 MiB tree copied in 6-9 s instead of 15 s on 2 cores).
                "GET",
                f"/v1/archive/{path}",
                params={"level": 0},
                timeout=timeout,
            ) as resp:
                if resp.status_code >= 400:
                    detail = (await resp.aread()).decode(errors="replace")[:300]
                    raise RuntimeRefused(
                        resp.status_code, f"export of {path or 'the workspace'} refused", detail
                    )

                async def body() -> Any:
                    nonlocal streamed
                    async for chunk in resp.aiter_raw():
                        streamed += len(chunk)
                        yield chunk

                await target._request(
                    "POST",
                    f"/v1/archive/{path}",
                    content=body(),
                    headers={"content-type": "application/gzip"},
                    timeout=timeout,
                )
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"copy interrupted: {type(exc).__name__}: {exc}") from None
        return streamed
