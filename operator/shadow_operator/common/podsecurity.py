"""Pod Security admission's namespace labels: the operator applies them to tenant namespaces
(resources/podsecurity.py), `shadowctl doctor` reads them."""

from __future__ import annotations

LEVELS = ("privileged", "baseline", "restricted")
LABEL_PREFIX = "pod-security.kubernetes.io/"
ENFORCE_LABEL = f"{LABEL_PREFIX}enforce"
