"""Where each source of an environment came from on this machine, recorded on this machine.

The environment's annotations `local.shadow.dev/<source>` say the same, but anyone who may patch the object
(another tenant of the namespace, a controller) can change them, e.g. to `~`; promote writes there. So the
client records the directories itself when it creates, uploads or forks an environment, in
`$XDG_STATE_HOME/shadow-operator/environments/<cluster>/<namespace>/<name>.json` (`~/.local/state` without
XDG_STATE_HOME; `<cluster>` is a hash of the API server's URL), and promote takes an annotation only when it
matches this record (`trusted_dir`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "shadow-operator" / "environments"


def _file(cluster: str, namespace: str, name: str) -> Path:
    key = hashlib.sha256(cluster.rstrip("/").encode()).hexdigest()[:16]
    return state_dir() / key / namespace / f"{name}.json"


def recorded(cluster: str, namespace: str, name: str) -> dict[str, str]:
    """source -> local directory, as recorded here (empty when nothing is)."""
    try:
        data = json.loads(_file(cluster, namespace, name).read_text())
    except (OSError, ValueError):
        return {}
    sources = data.get("sources") if isinstance(data, dict) else None
    if not isinstance(sources, dict):
        return {}
    return {str(k): str(v) for k, v in sources.items() if isinstance(v, str)}


def record(cluster: str, namespace: str, name: str, dirs: Mapping[str, str | os.PathLike[str]]) -> None:
    """Add (or replace) the local directories of some sources of an environment."""
    if not dirs:
        return
    sources = recorded(cluster, namespace, name)
    sources.update({k: str(Path(v).expanduser().resolve()) for k, v in dirs.items()})
    path = _file(cluster, namespace, name)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump({"sources": sources}, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
