"""The Sandbox API reconcilers, one module per kind, run by the engine. Importing this package registers
them with kopf (`kopf run -m shadow_operator.controllers`, or `shadow-operator run`)."""

import kopf

from shadow_operator.controllers import previewkeys, settings
from shadow_operator.controllers.claim import ClaimReconciler
from shadow_operator.controllers.config import Config
from shadow_operator.controllers.environment import EnvironmentReconciler
from shadow_operator.controllers.envpool import EnvironmentPoolReconciler
from shadow_operator.controllers.sandbox import SandboxReconciler
from shadow_operator.controllers.template import TemplateReconciler
from shadow_operator.controllers.warmpool import WarmPoolReconciler
from shadow_operator.engine import Manager

RECONCILERS = (
    SandboxReconciler,
    ClaimReconciler,
    WarmPoolReconciler,
    TemplateReconciler,
    EnvironmentReconciler,
    EnvironmentPoolReconciler,
)

manager = Manager(
    RECONCILERS,
    load_config=Config.from_env,
    configure=settings.configure,
    prepare=settings.prepare,
    concurrency=settings.concurrency,
)
manager.register()
previewkeys.register()
kopf.on.login()(settings.login)

__all__ = [
    "RECONCILERS",
    "ClaimReconciler",
    "Config",
    "EnvironmentPoolReconciler",
    "EnvironmentReconciler",
    "SandboxReconciler",
    "TemplateReconciler",
    "WarmPoolReconciler",
    "manager",
]
