"""Utilization that tells the truth: model FLOPs and memory-bandwidth utilization per phase
(prefill, decode), counted from each engine step's batch and the model's shape (work.py) against
the device's peak (peak.py), over a recent window (meter.py)."""

from regional_node.utilization.meter import UtilizationMeter, UtilizationReport
from regional_node.utilization.peak import Peak, device_peak
from regional_node.utilization.work import PHASES, ModelShape

__all__ = ["PHASES", "ModelShape", "Peak", "UtilizationMeter", "UtilizationReport", "device_peak"]
