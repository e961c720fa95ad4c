"""The Responses API (text and function tools): request translation to the chat pipeline and runs
(their store, which drives them on the pipeline, is gateway/responses/store.py)."""

from gateway.responses.config import ResponsesConfig
from gateway.responses.errors import ResponsesBusy
from gateway.responses.run import Run
from gateway.responses.translate import ResponsesRequest, parse_request

__all__ = ["ResponsesBusy", "ResponsesConfig", "ResponsesRequest", "Run", "parse_request"]
