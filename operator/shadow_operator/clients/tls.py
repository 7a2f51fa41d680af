"""The TLS context the operator's HTTP clients (runtimes, Gitea) share.

httpx builds a new one for every client it opens, loading the CA bundle each time: tens of milliseconds of CPU
(150 ms on a loaded machine). The operator opens a client per pass that talks to a workspace or a Gitea, so at
hundreds of environments that was most of its CPU (BENCHMARKS.md, "Many tenants"). The context is what httpx
builds for a client with `trust_env=False` (certifi's bundle, hostnames checked), made once; an SSLContext may
serve any number of connections.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def client_context() -> ssl.SSLContext:
    return httpx.create_ssl_context(trust_env=False)
