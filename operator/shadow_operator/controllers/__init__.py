"""kopf handlers, one module per kind. Importing this package registers every handler."""
