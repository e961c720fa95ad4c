"""The router's exceptions. The gateway maps them to OpenAI error bodies in one place:
UnknownModelError → 404 `model_not_found`, ModelNotAllowedError → 403."""

from __future__ import annotations


class RoutingError(Exception):
    """Base of every error the router raises. `message` is safe to show to the client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnknownModelError(RoutingError):
    """The requested model is not in the catalog."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model '{model}' does not exist.")
        self.model = model


class ModelNotAllowedError(RoutingError):
    """The model exists but this tenant's policy does not allow it (or allows nothing for "auto")."""

    def __init__(self, model: str, tenant_id: str) -> None:
        super().__init__(f"Tenant '{tenant_id}' is not allowed to use the model '{model}'.")
        self.model = model
        self.tenant_id = tenant_id
