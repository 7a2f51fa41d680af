"""core/v1 Event manifests about our objects (messages never carry secrets)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from shadow_operator.resources.conditions import now_rfc3339

REPORTING_COMPONENT = "shadow-operator"


def build_event(obj: Mapping[str, Any], type_: str, reason: str, message: str) -> dict[str, Any]:
    meta = obj["metadata"]
    stamp = now_rfc3339()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name'][:200]}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": REPORTING_COMPONENT},
        "reportingComponent": REPORTING_COMPONENT,
        "reportingInstance": REPORTING_COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
