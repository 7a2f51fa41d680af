"""shadow-operator: isolated, disposable workspaces on Kubernetes (agent-sandbox compatible)."""

__version__ = "0.1.0"
