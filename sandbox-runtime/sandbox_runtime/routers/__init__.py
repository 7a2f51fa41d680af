"""One FastAPI router per API dialect the runtime speaks; `app.py` mounts them all.

- `legacy`: agent-sandbox's legacy Python runtime (`/execute`, `/upload`, `/download`, `/list`, `/exists`)
- `amicable`: Amicable (`/healthz`, `/exec`, `/list?dir=`, `/write_b64`)
- `sandboxd`: agent-sandbox's sandboxd REST API (`/v1/health`, `/v1/metadata`, `/v1/files/...`)
- `native`: our own `/v1` API (exec, processes, files, journal, metrics), with `workspace` (baseline,
  diff, archives) and `pty` (the WebSocket terminal)

Dialects do not import one another (an import-linter contract); what two of them share is in `common`.
"""
