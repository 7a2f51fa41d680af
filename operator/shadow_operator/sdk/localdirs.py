"""Where each source of an environment came from on this machine, recorded on this machine.

The environment's annotations `local.shadow.dev/<source>` say the same, but anyone who may patch the object
(another tenant of the namespace, a controller) can change them, e.g. to `~`; promote writes there. So the
client records the directories itself when it creates, uploads or forks an environment, in
`$XDG_STATE_HOME/shadow-operator/environments/<cluster>/<namespace>/<name>.json` (`~/.local/state` without
XDG_STATE_HOME; `<cluster>` is a hash of the API server's URL), and promote takes an annotation only when it
matches this record (`trusted_dir`). Beside them, what `sync` last pushed of each source (`pushed`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "shadow-operator" / "environments"


def _file(cluster: str, namespace: str, name: str) -> Path:
    key = hashlib.sha256(cluster.rstrip("/").encode()).hexdigest()[:16]
    return state_dir() / key / namespace / f"{name}.json"


def _read(cluster: str, namespace: str, name: str) -> dict[str, Any]:
    try:
        data = json.loads(_file(cluster, namespace, name).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(cluster: str, namespace: str, name: str, data: dict[str, Any]) -> None:
    path = _file(cluster, namespace, name)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def recorded(cluster: str, namespace: str, name: str) -> dict[str, str]:
    """source -> local directory, as recorded here (empty when nothing is)."""
    sources = _read(cluster, namespace, name).get("sources")
    if not isinstance(sources, dict):
        return {}
    return {str(k): str(v) for k, v in sources.items() if isinstance(v, str)}


def record(cluster: str, namespace: str, name: str, dirs: Mapping[str, str | os.PathLike[str]]) -> None:
    """Add (or replace) the local directories of some sources of an environment."""
    if not dirs:
        return
    data = _read(cluster, namespace, name)
    sources = recorded(cluster, namespace, name)
    sources.update({k: str(Path(v).expanduser().resolve()) for k, v in dirs.items()})
    _write(cluster, namespace, name, {**data, "sources": sources})


def pushed(cluster: str, namespace: str, name: str, source: str) -> dict[str, tuple[int, int]]:
    """What the last push of a source from here sent: relative path -> (mtime_ns, size) (`sdk.sync`)."""
    files = (_read(cluster, namespace, name).get("pushed") or {}).get(source)
    if not isinstance(files, dict):
        return {}
    return {str(k): (int(v[0]), int(v[1])) for k, v in files.items() if isinstance(v, list) and len(v) == 2}


def record_pushed(
    cluster: str, namespace: str, name: str, source: str, files: Mapping[str, tuple[int, int]]
) -> None:
    data = _read(cluster, namespace, name)
    data["pushed"] = {**(data.get("pushed") or {}), source: {k: list(v) for k, v in files.items()}}
    _write(cluster, namespace, name, data)


def copy(cluster: str, namespace: str, source: str, targets: Iterable[str]) -> None:
    """Forks come from the same directories as their source environment."""
    dirs = recorded(cluster, namespace, source)
    for target in targets:
        record(cluster, namespace, target, dirs)


def forget(cluster: str, namespace: str, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        _file(cluster, namespace, name).unlink()


def trusted_dir(recorded_dir: str | None, annotated_dir: str | None) -> str | None:
    """The directory promote may use without --to: the recorded one, unless the annotation names another."""
    if recorded_dir is None:
        return None
    if annotated_dir is not None and Path(annotated_dir).expanduser().resolve() != Path(recorded_dir):
        return None
    return recorded_dir
