"""The static region directory: a YAML file listing the fleet's nodes.

```yaml
nodes:
  - node_id: us-east-1
    url: http://127.0.0.1:9001
    region: us-east
    jurisdiction: us
    models: [meridian-small, meridian-large]
    versions: {meridian-large: v2}   # optional: the version of each model it serves (rollouts)
```

A node's own /load report of its versions wins over the file's once the gateway has probed it.

The file is re-read when its modification time changes (checked every `poll_interval_s`), so
nodes can be added without restarting the gateway; a file that turns invalid is reported and the
last good membership stays in force, as the RegionDirectory contract asks.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import msgspec
import yaml

from gateway.config import ConfigError
from gateway.runtime.tasks import cancel_and_wait
from router.types import ModelVersion, NodeInfo

logger = logging.getLogger(__name__)


class _NodeEntry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    node_id: str
    url: str
    region: str
    jurisdiction: str
    models: list[str]
    versions: dict[str, str] = msgspec.field(default_factory=dict)


class _RegionsFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    nodes: list[_NodeEntry]


def parse_regions(text: str, *, source: str) -> tuple[NodeInfo, ...]:
    """Parse a regions file's text into nodes; ConfigError names the file and field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    try:
        parsed = msgspec.convert(data, _RegionsFile)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    ids = [entry.node_id for entry in parsed.nodes]
    duplicates = sorted({node_id for node_id in ids if ids.count(node_id) > 1})
    if duplicates:
        raise ConfigError(f"{source}: $.nodes: duplicate node_id {duplicates}")
    for index, entry in enumerate(parsed.nodes):
        if not entry.url.startswith(("http://", "https://")):
            raise ConfigError(f"{source}: $.nodes[{index}].url: expected an http(s) URL, got {entry.url!r}")
        unserved = sorted(set(entry.versions) - set(entry.models))
        if unserved:
            raise ConfigError(f"{source}: $.nodes[{index}].versions: not in its models: {unserved}")
    return tuple(
        NodeInfo(
            node_id=entry.node_id,
            url=entry.url.rstrip("/"),
            region=entry.region,
            jurisdiction=entry.jurisdiction,
            models=frozenset(entry.models),
            versions={model: ModelVersion(version) for model, version in entry.versions.items()},
        )
        for entry in parsed.nodes
    )


def load_regions(path: str | Path) -> tuple[NodeInfo, ...]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_regions(text, source=str(path))


class StaticDirectory:
    """RegionDirectory backed by a regions file."""

    def __init__(self, path: str | Path, *, poll_interval_s: float = 2.0) -> None:
        self._path = Path(path)
        self._poll_interval_s = poll_interval_s
        self._nodes: tuple[NodeInfo, ...] = ()
        self._mtime_ns: int | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # The first read must succeed: a gateway with a broken regions file should not come up.
        self._mtime_ns = self._current_mtime()
        self._nodes = load_regions(self._path)
        self._task = asyncio.create_task(self._watch(), name="static-directory-watch")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def snapshot(self) -> tuple[NodeInfo, ...]:
        return self._nodes

    def _current_mtime(self) -> int | None:
        try:
            return self._path.stat().st_mtime_ns
        except OSError:
            return None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval_s)
            mtime = self._current_mtime()
            if mtime is None or mtime == self._mtime_ns:
                continue
            self._mtime_ns = mtime
            try:
                self._nodes = load_regions(self._path)
                logger.info("regions file %s reloaded: %d nodes", self._path, len(self._nodes))
            except ConfigError as exc:
                logger.error("keeping the last good membership: %s", exc)
