"""The Responses API (text subset): request translation to the chat pipeline, runs, and their store."""

from gateway.responses.config import ResponsesConfig
from gateway.responses.errors import ResponsesBusy
from gateway.responses.run import Run
from gateway.responses.store import ResponseStore
from gateway.responses.translate import ResponsesRequest, parse_request

__all__ = ["ResponseStore", "ResponsesBusy", "ResponsesConfig", "ResponsesRequest", "Run", "parse_request"]
