"""One SQL store style on the ledger's database: every operation of the usage ledger and of the
batch store is written once, as a generator of its statements (gateway/ledger/store/operation.py),
and the SQLite and PostgreSQL stores add nothing but where they run. (Their behaviour on both
databases is tested in tests/ledger and tests/gateway/test_batch_store.py.)"""

from __future__ import annotations

import inspect

import pytest

from gateway.batches.store import BatchStore, PostgresBatchStore, SqliteBatchStore
from gateway.ledger.store import LedgerStore, PostgresLedger, SqliteLedger

WHERE_THEY_RUN = {"_run", "start", "close"}


@pytest.mark.parametrize(
    ("base", "stores"),
    [(LedgerStore, (SqliteLedger, PostgresLedger)), (BatchStore, (SqliteBatchStore, PostgresBatchStore))],
    ids=["ledger", "batches"],
)
def test_each_operation_is_written_once_for_both_databases(base: type, stores: tuple[type, ...]) -> None:
    operations = {name for name, value in vars(base).items() if hasattr(value, "__wrapped__")}
    assert len(operations) >= 4
    for name in operations:
        assert inspect.isgeneratorfunction(vars(base)[name].__wrapped__), name
        assert inspect.iscoroutinefunction(getattr(base, name)), name
    for store in stores:
        assert issubclass(store, base)
        own = {name for name, value in vars(store).items() if callable(value) and not name.startswith("__")}
        assert own <= WHERE_THEY_RUN, (store.__name__, own - WHERE_THEY_RUN)
