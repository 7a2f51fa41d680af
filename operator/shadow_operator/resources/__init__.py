"""Pure functions that build child manifests (dict in, dict out)."""
