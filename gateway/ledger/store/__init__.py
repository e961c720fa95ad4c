"""The ledger store: raw usage events and minute/hour/day rollups, in SQLite or PostgreSQL."""

from gateway.ledger.store.interface import AggregateQuery, AggregateRow
from gateway.ledger.store.operations import LedgerStore
from gateway.ledger.store.postgres import PostgresLedger
from gateway.ledger.store.sqlite import SqliteLedger

__all__ = ["AggregateQuery", "AggregateRow", "LedgerStore", "PostgresLedger", "SqliteLedger"]
