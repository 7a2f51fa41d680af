"""API models (pydantic): the single source of truth for the CRDs and their docs."""
