"""The gateway's HTTP front doors, one controller module each, registered by gateway.app."""

from gateway.api.admin_routes import AdminController, MetricsController
from gateway.api.anthropic_routes import AnthropicController
from gateway.api.batches_routes import BatchesController, FilesController
from gateway.api.models_routes import ModelsController
from gateway.api.openai_routes import OpenAIController
from gateway.api.openapi import OpenAPIController
from gateway.api.quota_routes import QuotaController
from gateway.api.responses_routes import ResponsesController
from gateway.api.usage_routes import UsageController

# Every front door create_app registers by default; a new one (e.g. /v1/messages) joins here.
FRONT_DOORS = (
    OpenAIController,
    AnthropicController,
    ModelsController,
    ResponsesController,
    FilesController,
    BatchesController,
    UsageController,
    QuotaController,
    OpenAPIController,
    AdminController,
)

__all__ = [
    "FRONT_DOORS",
    "AdminController",
    "AnthropicController",
    "BatchesController",
    "FilesController",
    "MetricsController",
    "ModelsController",
    "OpenAIController",
    "OpenAPIController",
    "QuotaController",
    "ResponsesController",
    "UsageController",
]
