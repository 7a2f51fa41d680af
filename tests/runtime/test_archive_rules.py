"""The archive rules the runtime applies itself where Python lacks extraction filters (Debian bookworm's
3.11.2, which the workspace image runs): the same verdicts as Python's "data" filter on the same members."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from sandbox_runtime.archive import check_member
from sandbox_runtime.errors import ApiError

pytestmark = pytest.mark.unit


def member(
    name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", mode: int = 0o644
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    return info


ALLOWED = [
    member("src/app.py"),
    member("src", tarfile.DIRTYPE, mode=0o755),
    member("src/link", tarfile.SYMTYPE, linkname="app.py"),
    member("src/up", tarfile.SYMTYPE, linkname="../README"),
    member("src/hard", tarfile.LNKTYPE, linkname="src/app.py"),
]
REFUSED = [
    member("../escape"),
    member("src/abs", tarfile.SYMTYPE, linkname="/etc/passwd"),
    member("src/out", tarfile.SYMTYPE, linkname="../../outside"),
    member("src/hard", tarfile.LNKTYPE, linkname="../outside"),
    member("dev", tarfile.CHRTYPE),
    member("fifo", tarfile.FIFOTYPE),
]


@pytest.mark.parametrize("info", ALLOWED, ids=lambda m: m.name)
def test_allowed_members_pass_like_the_data_filter(info: tarfile.TarInfo, tmp_path: Path) -> None:
    if hasattr(tarfile, "data_filter"):
        tarfile.data_filter(info, str(tmp_path))  # raises if Python's own filter disagrees
    assert check_member(info, str(tmp_path)) is info


@pytest.mark.parametrize("info", REFUSED, ids=lambda m: f"{m.name}->{m.linkname}")
def test_refused_members_are_refused_like_the_data_filter(info: tarfile.TarInfo, tmp_path: Path) -> None:
    if hasattr(tarfile, "data_filter"):
        with pytest.raises(tarfile.FilterError):
            tarfile.data_filter(info, str(tmp_path))
    with pytest.raises(ApiError) as err:
        check_member(info, str(tmp_path))
    assert err.value.status == 400 and info.name in str(err.value.message)


def test_modes_lose_setuid_and_world_write(tmp_path: Path) -> None:
    assert check_member(member("x", mode=0o4777), str(tmp_path)).mode == 0o755
    assert check_member(member("y", mode=0o400), str(tmp_path)).mode == 0o600
