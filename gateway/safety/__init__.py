"""The safety layer: rules and blocklists, a classifier, per-tenant content policy, stream
hold-back and an audit log (gateway/README.md, "Safety"). Modules here import nothing from the
rest of the gateway's request path; the pipeline calls `SafetyGuard` (guard.py)."""
