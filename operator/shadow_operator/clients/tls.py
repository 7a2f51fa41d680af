"""The one TLS context of the operator's HTTP clients of workspaces and Gitea.

A reconcile opens a client of an environment's runtime (and of its Gitea) for the calls of that pass, and httpx
builds a new SSL context for each client it makes, reading the whole CA bundle: 15-20 ms of CPU on an idle
machine, paid on every look at a running verify even when the URL is plain HTTP. One context, made on first use
and shared (its settings are never changed after), costs that once per process.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def context() -> ssl.SSLContext:
    """httpx's default verifying context (certifi's bundle), made once."""
    return httpx.create_ssl_context()
