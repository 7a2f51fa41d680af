"""The reconcile engine: typed reconcilers over informer caches, a work queue, and one `apply()`.

Built on kopf (the watch and event layer): see `manager.py` for how the pieces meet, `reconciler.py` for what
a reconciler declares.
"""

from shadow_operator.engine.cache import Cache, Store
from shadow_operator.engine.client import Client
from shadow_operator.engine.concurrency import gather_bounded
from shadow_operator.engine.errors import NotOwned, PermanentError, RequeueAfter
from shadow_operator.engine.events import EventRecorder
from shadow_operator.engine.manager import Concurrency, Manager
from shadow_operator.engine.operations import RUNNING, Operations, Outcome, Running
from shadow_operator.engine.queue import Backoff, WorkQueue
from shadow_operator.engine.reconciler import Cached, Deps, Index, Reconciler, Watch, controller_keys

__all__ = [
    "RUNNING",
    "Backoff",
    "Cache",
    "Cached",
    "Client",
    "Concurrency",
    "Deps",
    "EventRecorder",
    "Index",
    "Manager",
    "NotOwned",
    "Operations",
    "Outcome",
    "PermanentError",
    "Reconciler",
    "RequeueAfter",
    "Running",
    "Store",
    "Watch",
    "WorkQueue",
    "controller_keys",
    "gather_bounded",
]
