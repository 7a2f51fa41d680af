"""Code the operator and its clients (SDK, CLI) both need: pure functions and data over API objects, no I/O.

Neither side's internals: `common` imports only `api` (the models and constants), pydantic (as `api` does) and
the standard library, so the light client can import it without the operator's dependencies, and the operator
without the SDK's.
Not in `api/` because `api/` is the CRDs' source of truth (models that crdgen turns into schemas); this is
logic over those objects (source plans, snapshot class choice, preview token signing).
"""
