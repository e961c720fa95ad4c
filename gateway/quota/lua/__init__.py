"""The quota Lua scripts (data files, read by gateway.quota.scripts)."""
