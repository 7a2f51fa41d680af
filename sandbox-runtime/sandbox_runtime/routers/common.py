"""What the dialect routers share: the Runtime dependency, error responses, NDJSON, compat listings."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends
from starlette.requests import HTTPConnection

from .. import files
from ..models import Error, LegacyEntry, LegacyExecRequest, LegacyExecResponse
from ..runtime import Runtime

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Error},
    403: {"model": Error},
    404: {"model": Error},
    409: {"model": Error},
}
NDJSON = "application/x-ndjson"


async def get_runtime(conn: HTTPConnection) -> Runtime:
    # async: FastAPI would run a plain function in a worker thread, a hop on every request.
    runtime: Runtime = conn.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def ndjson(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        async for ev in events:
            yield (json.dumps(ev, separators=(",", ":")) + "\n").encode()

    return gen()


def compat_type(t: str) -> str:
    # Legacy and sandboxd clients accept only file|directory.
    return "directory" if t == "directory" else "file"


async def legacy_listing(rt: Runtime, path: str) -> list[LegacyEntry]:
    """The legacy runtime's `/list/{path}` (Amicable's `/list` without `dir` is the same listing)."""
    res = rt.root.resolve(path)
    entries = await rt.blocking(files.list_dir, rt.root, res)
    return [
        LegacyEntry(name=e["name"], size=e["size"], type=compat_type(e["type"]), mod_time=e["mtime"])
        for e in entries
    ]


async def run_command_line(rt: Runtime, req: LegacyExecRequest) -> LegacyExecResponse:
    """`/execute` (legacy) and `/exec` (Amicable): one command string, counted and journaled as `execute`."""
    res = await rt.exec.run(await rt.exec.spec_from_command_line(req), "execute")
    return LegacyExecResponse(
        stdout=text(res.stdout), stderr=text(res.stderr), exit_code=res.exit_code, timed_out=res.timed_out
    )
