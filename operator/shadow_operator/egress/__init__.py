"""The egress gateway (issue 29): an allowlisting HTTP(S) proxy built on mitmproxy, one per cluster.

It runs in its own image and virtualenv (mitmproxy pins its dependencies tightly): nothing else imports it.
"""
