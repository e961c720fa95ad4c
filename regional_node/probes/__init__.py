"""Synthetic golden-output probes: certify a model version, then check on every node that it
still answers as certified (golden.py: the file; prober.py: running it; certify.py: the command)."""

from regional_node.probes.golden import GOLDEN_FILE, GoldenFileError, GoldenSet, golden_path, read_golden
from regional_node.probes.prober import ModelProber, ProbeState

__all__ = [
    "GOLDEN_FILE",
    "GoldenFileError",
    "GoldenSet",
    "ModelProber",
    "ProbeState",
    "golden_path",
    "read_golden",
]
