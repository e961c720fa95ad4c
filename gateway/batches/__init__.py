"""Files and Batches, OpenAI-compatible: input files, batches of requests run at the batch
traffic tier through the request pipeline, and their output files; state in the ledger's
database, file contents behind FileStorage. `Batches` and `build_batches` are in
gateway/batches/batches.py (not re-exported here: gateway.config imports this package's config,
and the runner imports the pipeline, which imports gateway.config)."""

from gateway.batches.config import BatchesConfig
from gateway.batches.errors import BatchInputError, BatchNotFound, BatchStoreUnavailable, FileTooLarge

__all__ = ["BatchInputError", "BatchNotFound", "BatchStoreUnavailable", "BatchesConfig", "FileTooLarge"]
