"""Where file contents live: a small interface, and a local directory (one file per id).

Object storage (S3 and the like) would be a second implementation of FileStorage; every gateway
replica that shares a batch store must also share its file storage.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Protocol


class FileStorage(Protocol):
    async def put(self, file_id: str, data: bytes) -> None: ...

    async def get(self, file_id: str) -> bytes:
        """The content; FileNotFoundError if it is gone."""
        ...

    async def delete(self, file_id: str) -> None: ...


class LocalFileStorage:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def _path(self, file_id: str) -> Path:
        assert file_id.replace("-", "").replace("_", "").isalnum(), file_id  # ids are ours: no paths
        return self.directory / file_id

    async def put(self, file_id: str, data: bytes) -> None:
        await asyncio.to_thread(self._put, file_id, data)

    def _put(self, file_id: str, data: bytes) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(file_id)
        partial = path.with_suffix(".partial")
        with open(partial, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)  # readers see the whole file or none

    async def get(self, file_id: str) -> bytes:
        return await asyncio.to_thread(self._path(file_id).read_bytes)

    async def delete(self, file_id: str) -> None:
        await asyncio.to_thread(self._path(file_id).unlink, True)
