"""How the stores on the ledger's database (the usage ledger, the batch store) are written: one
style for both. A store's operation is written once for SQLite and PostgreSQL, as a generator
method that yields the statements it runs (`%s` placeholders) and is sent back their results;
`@operation` turns it into the store's async method, which hands the generator to the database's
driver (`SqliteFile.run_operation` in a thread, `PostgresPool.run_operation` on the event loop),
inside a transaction where the operation reads then writes or must change several rows together.
A store subclass says only where its database is (`_run`); what differs between the databases
beyond that is a value the operation reads (a dialect), never a second copy of the operation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True)
class Statement:
    sql: str
    params: Sequence[Any] = ()
    many: bool = False  # `params` is a sequence of parameter rows, one run each
    fetch: bool = False  # the rows come back


@dataclass(frozen=True)
class Reply:
    rows: list[tuple[Any, ...]]
    rowcount: int


Operation = Generator[Statement, Reply, T]


class Runs(Protocol):
    async def _run(self, operation: Operation[Any], *, transaction: bool = False) -> Any: ...


S = TypeVar("S", bound=Runs)


def operation(
    *, transaction: bool = False
) -> Callable[
    [Callable[Concatenate[S, P], Operation[T]]], Callable[Concatenate[S, P], Coroutine[Any, Any, T]]
]:
    """The store method that runs this generator method's statements on the store's database."""

    def wrap(
        steps: Callable[Concatenate[S, P], Operation[T]],
    ) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
        @functools.wraps(steps)
        async def run(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
            result: T = await self._run(steps(self, *args, **kwargs), transaction=transaction)
            return result

        return run

    return wrap
