"""kopf handlers, one module per kind. Importing this package registers every handler."""

from shadow_operator.controllers import claim, sandbox, settings, template, warmpool

__all__ = ["claim", "sandbox", "settings", "template", "warmpool"]
