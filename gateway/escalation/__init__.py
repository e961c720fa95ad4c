"""Tiered escalation for `model: "auto"`: its config section and the thrash guard.

The pure decisions live in the router (router/classifier.py: where a request starts;
router/confidence.py: whether the small model's first tokens call for the large tier); this
package holds what the gateway keeps between requests.
"""

from gateway.escalation.config import AutoConfig, EscalationSection
from gateway.escalation.thrash import RateRule, ThrashGuard, ThrashRule

__all__ = ["AutoConfig", "EscalationSection", "RateRule", "ThrashGuard", "ThrashRule"]
