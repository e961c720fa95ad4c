"""The HTTP/1.1 server both the gateway and the nodes run: uvicorn, with limits it lacks.

uvicorn waits forever for a client that sends its headers or body slowly, and accepts any number
of connections; these are the bounds a public server needs (slowloris, oversized requests):

- `ServerLimits` (limits.py): the typed, documented limits, a `server:` section in each config;
- `server_config` (server.py): a uvicorn config whose connections enforce the connection cap, the
  header read timeout and the header size limit, answering in OpenAI's error format; and, where
  asked, whose client leaving cancels its request's task (`client_left` tells the app why);
- `read_body` (body.py): the request body within the size limit and the body read timeout, and
  `ClientDisconnected` when the client leaves before sending it;
- `EventStream` (stream.py): a streamed (SSE) response sent from the request's task, its frames
  closed however it ended (the client leaving included).
"""

from http_server.body import ClientDisconnected, read_body
from http_server.limits import ServerLimits
from http_server.server import client_left, server_config
from http_server.stream import EventStream

__all__ = [
    "ClientDisconnected",
    "EventStream",
    "ServerLimits",
    "client_left",
    "read_body",
    "server_config",
]
