"""`Section`: the base of every gateway config struct (gateway/config.py and the sections defined
next to the code that uses them: ledger, escalation, ...). Its own module because those sections'
modules import it while gateway/config.py imports them.

Unknown keys are errors, so a typo fails at start-up instead of being ignored; frozen, because a
config is read, never edited, once validated (`msgspec.structs.replace` makes a changed copy).
"""

from __future__ import annotations

import msgspec


class Section(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    pass
