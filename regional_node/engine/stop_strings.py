"""Stop-string matching over streamed text.

Text that might be the start of a stop string is held back until the next text settles it, so a
client never sees part of a stop string; the matched stop string itself is never emitted.
"""

from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._pending = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """Returns (text safe to emit now, the stop string found or None).

        Of the stop strings this text completes, the one that starts first wins (at the same start,
        the first listed), so the text emitted is exactly the text before the stop string reported.
        """
        if not self._stops:
            return text, None
        # Emitted text never ends with the start of a stop string (that part stays pending), so
        # any match must start inside the pending text.
        pending = self._pending + text
        found = [(at, i) for i, at in enumerate(pending.find(s) for s in self._stops) if at >= 0]
        if found:
            cut, first = min(found)
            self._pending = ""
            return pending[:cut], self._stops[first]
        hold = self._held_suffix(pending)
        self._pending = pending[len(pending) - hold :] if hold else ""
        return pending[: len(pending) - hold], None

    def flush(self) -> str:
        """The held-back text, when the sequence ends for another reason."""
        pending, self._pending = self._pending, ""
        return pending

    def _held_suffix(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of some stop string."""
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:k]):
                    best = k
                    break
        return best
