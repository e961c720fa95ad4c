"""The production batch store: the ledger's PostgreSQL database, its own tables
(gateway/batches/store/operations.py says what they hold and how leases work), psycopg 3 async.

Several gateways share the tables. Claims lock the rows they are about to lease with
`FOR UPDATE ... SKIP LOCKED`, so two gateways claiming at once neither wait on each other nor take
the same line: the second takes the next lines in turn.
"""

from __future__ import annotations

from typing import TypeVar

from gateway.batches.errors import BatchStoreUnavailable
from gateway.batches.store.operations import BatchStore
from gateway.batches.store.sql import Dialect, schema
from gateway.ledger.store.bulk import POSTGRES
from gateway.ledger.store.operation import Operation
from gateway.ledger.store.pool import PostgresPool

T = TypeVar("T")

# The first key of the advisory lock that serializes one tenant's batch creates (the second is
# the tenant's hash), so it never meets another use of advisory locks on the same database.
_ENQUEUE_LOCK_SPACE = 1_801_806_418

DIALECT = Dialect(
    bulk=POSTGRES,
    seq_column="seq BIGSERIAL NOT NULL UNIQUE",
    next_seq="DEFAULT",
    lock_rows=" FOR UPDATE OF {} SKIP LOCKED",
    # Counting the tenant's enqueued lines then inserting is only atomic if no other create of
    # the same tenant runs in between. Locking the tenant's rows (SELECT ... FOR UPDATE) cannot
    # do it: a tenant with no batch yet has no row to lock, and under READ COMMITTED two creates
    # would both count the same lines and both insert. A transaction-scoped advisory lock on the
    # tenant serializes the creates (a hash collision only makes two tenants wait on each other).
    tenant_lock=f"SELECT pg_advisory_xact_lock({_ENQUEUE_LOCK_SPACE}, hashtext(%s))",
)


class PostgresBatchStore(BatchStore):
    name = "postgres"
    dialect = DIALECT

    def __init__(self, dsn: str, *, pool_size: int = 4, timeout_s: float = 5.0) -> None:
        self._pool = PostgresPool(
            dsn,
            size=pool_size,
            timeout_s=timeout_s,
            schema=schema(DIALECT),
            unavailable=BatchStoreUnavailable,
        )

    async def start(self) -> None:
        async with self._pool.connection():
            pass  # opening the pool creates the tables

    async def close(self) -> None:
        await self._pool.close()

    async def _run(self, operation: Operation[T], *, transaction: bool = False) -> T:
        import psycopg

        try:
            return await self._pool.run_operation(operation, transaction=transaction)
        except (psycopg.OperationalError, psycopg.InterfaceError):
            raise  # the pool replaces the connection and raises BatchStoreUnavailable
        except psycopg.Error as exc:
            raise BatchStoreUnavailable(f"postgres: {type(exc).__name__}: {exc}") from exc
