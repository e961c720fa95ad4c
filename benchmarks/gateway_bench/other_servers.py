"""Meridian's gateway app under another ASGI server, for `gateway_overhead.py --servers`.

    python -m gateway_bench.other_servers {granian,hypercorn} CONFIG PORT

The app is the one `meridian gateway --config CONFIG` builds (same config, same logging, same
collector tuning once it has started); only the server around it differs, each on uvloop with
one worker and its access log off, so the benchmark measures the server and nothing else.
uvicorn is the CLI itself (`meridian gateway`), not this module.
"""

from __future__ import annotations

import os
import sys

CONFIG_ENV = "MERIDIAN_BENCH_CONFIG"


def app_factory():  # type: ignore[no-untyped-def]  # granian's --factory target
    from gateway.runtime.serve import tune_gc_for_serving
    from meridian.cli import _worker_app

    app = _worker_app(os.environ[CONFIG_ENV])
    tune_gc_for_serving()  # as `meridian gateway` does (there once the lifespan ran)
    return app


def _granian(port: int) -> None:
    from granian.constants import Interfaces, Loops
    from granian.server import Server

    Server(
        "gateway_bench.other_servers:app_factory",
        address="127.0.0.1",
        port=port,
        interface=Interfaces.ASGI,
        workers=1,
        loop=Loops.uvloop,
        factory=True,
        log_access=False,
    ).serve()


def _hypercorn(port: int) -> None:
    import uvloop
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.keep_alive_timeout = 65
    app = app_factory()
    uvloop.run(serve(app, config))  # type: ignore[arg-type]


def main(argv: list[str]) -> int:
    server, config, port = argv
    os.environ[CONFIG_ENV] = config
    {"granian": _granian, "hypercorn": _hypercorn}[server](int(port))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
