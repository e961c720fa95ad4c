"""Calling the quota Lua scripts: EVALSHA, and SCRIPT LOAD + retry only when Redis answers NOSCRIPT.

The SHA1 is computed here rather than asked from Redis, so the first call after start-up is
already a single EVALSHA. A NOSCRIPT reply means an empty script cache (a new or restarted
Redis, or SCRIPT FLUSH), so all scripts are loaded at once: the next settle or renew does not
pay for its own load.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError


class LuaScript:
    def __init__(self, name: str):
        self.name = name
        self.text = resources.files("gateway.quota.lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")
        self.sha = hashlib.sha1(self.text.encode()).hexdigest()


class QuotaScripts:
    """The four scripts, read once per process."""

    def __init__(self) -> None:
        self.admit = LuaScript("admit")
        self.settle = LuaScript("settle")
        self.renew = LuaScript("renew")
        self.usage = LuaScript("usage")

    async def load_all(self, client: Any) -> None:
        for script in (self.admit, self.settle, self.renew, self.usage):
            await client.script_load(script.text)

    async def run(
        self, client: Any, script: LuaScript, keys: tuple[str, ...], args: tuple[str | int | bytes, ...]
    ) -> Any:
        """`client` is a redis.asyncio Redis or RedisCluster."""
        try:
            return await client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self.load_all(client)
            return await client.evalsha(script.sha, len(keys), *keys, *args)
