"""Errors a reconcile may raise to steer the work queue (anything else is retried with backoff)."""

from __future__ import annotations


class ReconcileError(Exception):
    """Base of the engine's own errors."""


class RequeueAfter(ReconcileError):
    """Not an error: run this key again after `delay` seconds (waiting for something outside our watches)."""

    def __init__(self, delay: float, message: str = "") -> None:
        super().__init__(message or f"requeue in {delay:.2f}s")
        self.delay = delay


class PermanentError(ReconcileError):
    """Input that will never work as it is: logged and not retried until the object changes."""


class NotOwned(ReconcileError):
    """A child's deterministic name is taken by an object the owner does not control."""

    def __init__(self, obj: dict[str, object], message: str) -> None:
        super().__init__(message)
        self.obj = obj
