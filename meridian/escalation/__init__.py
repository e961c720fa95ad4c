"""`meridian escalation ...`: tools for the `auto` confidence cascade (calibrate a threshold)."""
