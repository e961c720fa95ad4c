"""A short, stable hash of a checkpoint folder, so replicas of one model version can be compared.

Cheap on purpose (it runs once per model per process, not per request): the bytes of
config.json plus the name and size of every other file in the folder. Two replicas that loaded
different weights under one version almost always differ in some file's size or config; hashing
gigabytes of weights at start-up would only catch the rare same-size edit.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from regional_node.probes.golden import GOLDEN_FILE


@functools.lru_cache(maxsize=64)
def checkpoint_hash(path: str) -> str:
    """16 hex characters of BLAKE2b over the folder's config.json and file names and sizes;
    "" when the folder cannot be read (the node reports no hash rather than a wrong one)."""
    folder = Path(path)
    digest = hashlib.blake2b(digest_size=8)
    try:
        digest.update((folder / "config.json").read_bytes())
        for item in sorted(folder.iterdir()):
            # The golden file is written next to the weights after they are certified: not part
            # of what was loaded.
            if item.is_file() and item.name not in ("config.json", GOLDEN_FILE):
                digest.update(f"\x00{item.name}\x00{item.stat().st_size}".encode())
    except OSError:
        return ""
    return digest.hexdigest()
