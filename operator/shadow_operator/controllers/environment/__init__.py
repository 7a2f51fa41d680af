"""The ShadowEnvironment reconciler as a package of steps over a typed status.

    reconciler.py  the pass: preflight, the workspace Sandbox, the steps in order, the status write
    gitea.py       Gitea's children and bootstrap          clone.py   a fork's snapshot or copy
    copyin.py      sources in, push requests answered      verify.py  the verdict
    idle.py        suspend and resume                      pushes.py  snapshot-and-push (copy-in, promote)
    state.py       the typed status of a pass, StepFailed, the ports the steps talk through (Ports)

Layers (pyproject.toml, import-linter): reconciler -> the steps (independent of one another) -> pushes ->
state. A step needs another's result only through the status the reconciler hands it.
"""

from shadow_operator.controllers.environment.reconciler import EnvironmentReconciler

__all__ = ["EnvironmentReconciler"]
