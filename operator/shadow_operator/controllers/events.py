"""Kubernetes Events about our objects (posted by kopf in the background; never carry secrets)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf


def info(obj: Mapping[str, Any], reason: str, message: str) -> None:
    kopf.info(cast(kopf.Body, obj), reason=reason, message=message)


def warn(obj: Mapping[str, Any], reason: str, message: str) -> None:
    kopf.warn(cast(kopf.Body, obj), reason=reason, message=message)
