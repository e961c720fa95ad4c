"""The Files and Batches APIs' domain errors (mapped to HTTP once, in gateway/errors.py)."""

from __future__ import annotations

from typing import Any


class BatchInputError(Exception):
    """A request the Files or Batches API refuses (a 400), or a batch input file's fault (the
    batch's `errors`): what is wrong, and where (param, and the file's line where there is one)."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str = "invalid_request",
        line: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.line = line

    def batch_error(self) -> dict[str, Any]:
        """As an item of a failed batch's `errors.data`."""
        return batch_error(self.code, self.message, param=self.param, line=self.line)


def batch_error(
    code: str, message: str, *, param: str | None = None, line: int | None = None
) -> dict[str, Any]:
    """An item of a failed batch's `errors.data` (OpenAI's BatchError)."""
    return {"code": code, "message": message, "param": param, "line": line}


class BatchNotCancellable(Exception):
    """The batch already ended: only a running one can be cancelled."""

    def __init__(self, batch_id: str, status: str) -> None:
        super().__init__(f"Batch '{batch_id}' is {status}: only a batch still running can be cancelled.")
        self.message = str(self)


class FileTooLarge(BatchInputError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"The file is {size} bytes; the limit is {limit} bytes.", param="file", code="file_too_large"
        )


class BatchNotFound(Exception):
    """An unknown id, a deleted file, or another tenant's: all look the same to the caller."""

    def __init__(self, kind: str, object_id: str) -> None:
        super().__init__(f"No {kind} found with id '{object_id}'.")
        self.message = str(self)
        self.param = f"{kind}_id"


class BatchStoreUnavailable(Exception):
    """The batch store (the ledger's database) cannot be reached."""
