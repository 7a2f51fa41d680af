"""Thin wrappers over the Kubernetes API and the sandbox runtime."""
