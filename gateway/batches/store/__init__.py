"""Where batch state lives: files, batches, lines and their leases."""

from gateway.batches.store.operations import BatchStore
from gateway.batches.store.postgres import PostgresBatchStore
from gateway.batches.store.sqlite import SqliteBatchStore

__all__ = ["BatchStore", "PostgresBatchStore", "SqliteBatchStore"]
