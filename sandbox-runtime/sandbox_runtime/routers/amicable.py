"""Amicable: `/healthz`, `/exec`, `/list?dir=`, `/write_b64` (and the legacy `/download` it also uses)."""

from __future__ import annotations

import base64
import binascii
import os
from typing import Annotated

from fastapi import APIRouter, Query

from .. import files
from ..errors import bad_request, not_found
from ..models import (
    AmicableList,
    Health,
    LegacyEntry,
    LegacyExecRequest,
    LegacyExecResponse,
    WriteB64Request,
    WriteB64Response,
)
from ..transfer import check_upload_size
from .common import ERRORS, RuntimeDep, legacy_listing, run_command_line

router = APIRouter()


@router.get(
    "/healthz",
    response_model=Health,
    response_model_exclude_none=True,
    tags=["health"],
    summary="Health (Amicable)",
)
async def healthz() -> Health:
    return Health(status="ok")


@router.post("/exec", response_model=LegacyExecResponse, tags=["compat"], responses=ERRORS)
async def exec_alias(req: LegacyExecRequest, rt: RuntimeDep) -> LegacyExecResponse:
    """Amicable's first choice; same shape as /execute."""
    return await run_command_line(rt, req)


@router.get("/list", response_model=AmicableList | list[LegacyEntry], tags=["compat"], responses=ERRORS)
async def amicable_list(
    rt: RuntimeDep,
    dir: Annotated[str | None, Query()] = None,
) -> AmicableList | list[LegacyEntry]:
    """Amicable (`?dir=`): every file under `dir`, as paths relative to the root, directories excluded.

    Without `dir` this is the legacy listing of the root: the SDK's `list(".")` reaches us as `/list`
    because HTTP clients drop the `.` segment. Dependency and VCS directories (node_modules, .git) and
    the runtime's state are skipped in the Amicable form; they dominate the cost on real trees.
    """
    if dir is None:
        return await legacy_listing(rt, "")
    res = rt.root.resolve(dir)
    if not os.path.isdir(res.path):
        raise not_found(f"no such directory: {res.rel or '.'}")
    prune = frozenset({"node_modules", ".git", os.path.basename(rt.settings.state)})
    return AmicableList(files=await rt.blocking(files.list_files, rt.root, res.path, prune))


@router.post("/write_b64", response_model=WriteB64Response, tags=["compat"], responses=ERRORS)
async def write_b64(req: WriteB64Request, rt: RuntimeDep) -> WriteB64Response:
    try:
        data = base64.b64decode(req.content_b64, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("content_b64 is not valid base64") from None
    check_upload_size(len(data), rt.settings.max_upload)
    w = files.AtomicWriter(rt.root, req.path)
    try:
        w.write(data)
        w.commit()
    except BaseException:
        w.abort()
        raise
    rt.metrics.bytes_in.inc(len(data))
    return WriteB64Response(status="ok", path=w.res.rel, size=len(data))
