"""A few psycopg 3 async connections to one PostgreSQL database, shared by the stores that live
there (the ledger, the batch store), each with a pool of its own.

The pool opens lazily and creates its owner's tables on the first connection that works, so a
database that was down at start-up is set up once it comes back. A connection that fails (an
OperationalError or InterfaceError: the server went away) is replaced; when none can be, the
next call opens a new pool. Every failure to reach the database is raised as the owner's own
"unavailable" error, which its API maps to 503.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, nullcontext
from typing import Any, TypeVar

from gateway.ledger.store.operation import Operation, Reply

T = TypeVar("T")


class PostgresPool:
    def __init__(
        self,
        dsn: str,
        *,
        size: int,
        timeout_s: float,
        schema: Sequence[str],
        unavailable: type[Exception],
    ) -> None:
        self._dsn = dsn
        self._size = size
        self._timeout_s = timeout_s
        self._schema = tuple(schema)
        self._unavailable = unavailable
        self._idle: asyncio.Queue[Any] | None = None
        self._all: list[Any] = []
        self._opening = asyncio.Lock()

    async def _connect(self) -> Any:
        import psycopg

        return await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, connect_timeout=max(1, int(self._timeout_s))
        )

    async def _open(self) -> None:
        async with self._opening:
            if self._idle is not None:
                return
            opened: list[Any] = []
            try:
                for _ in range(self._size):
                    opened.append(await self._connect())
                async with opened[0].transaction():
                    for statement in self._schema:
                        await opened[0].execute(statement)
            except BaseException:
                for conn in opened:
                    await conn.close()
                raise
            idle: asyncio.Queue[Any] = asyncio.Queue()
            for conn in opened:
                idle.put_nowait(conn)
            self._all = opened
            self._idle = idle

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """An autocommit connection, held until the block ends (`conn.transaction()` inside it
        for a transaction)."""
        import psycopg

        try:
            async with asyncio.timeout(self._timeout_s):
                if self._idle is None:
                    await self._open()
                assert self._idle is not None
                conn = await self._idle.get()
        except (psycopg.Error, OSError, TimeoutError) as exc:
            raise self._unavailable(f"postgres: {type(exc).__name__}: {exc}") from exc
        broken = False
        try:
            yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            broken = True
            raise self._unavailable(f"postgres: {type(exc).__name__}: {exc}") from exc
        finally:
            if broken or conn.closed:
                await self._replace(conn)
            else:
                self._idle.put_nowait(conn)

    async def run_operation(self, operation: Operation[T], *, transaction: bool = False) -> T:
        """Runs a store's operation (gateway/ledger/store/operation.py) on one connection, in a
        transaction if asked."""
        async with self.connection() as conn:
            async with conn.transaction() if transaction else nullcontext(), conn.cursor() as cursor:
                try:
                    statement = next(operation)
                    while True:
                        if statement.many:
                            await cursor.executemany(statement.sql, statement.params)
                        else:
                            await cursor.execute(statement.sql, statement.params)
                        rows = await cursor.fetchall() if statement.fetch else []
                        statement = operation.send(Reply(rows, cursor.rowcount))
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]

    async def _replace(self, conn: Any) -> None:
        import psycopg

        assert self._idle is not None
        self._all.remove(conn)
        try:
            await conn.close()
            fresh = await self._connect()
        except (psycopg.Error, OSError):
            if not self._all:  # every connection is gone: the next call opens a new pool
                self._idle = None
            return
        self._all.append(fresh)
        self._idle.put_nowait(fresh)

    async def close(self) -> None:
        conns, self._all, self._idle = self._all, [], None
        for conn in conns:
            await conn.close()
