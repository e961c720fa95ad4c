"""TEST ONLY: a kernel that goes wrong while the node runs, so tests can prove the probe schedule
catches it and the gateway routes around it.

Off in production builds: deploy/Dockerfile.dockerignore leaves this file out of the image, so
the node there cannot import it (regional_node/server/pool.py then skips it), whatever the
environment says. Elsewhere it acts only when MERIDIAN_TEST_FAULT_DIR is set: from the moment a
file named after a model appears in that folder, that model's logits come out shifted by one
vocabulary entry (every greedy token changes; the health checks stay green), and removing the
file mends it. Only our engine (`engine: meridian`) has the hook; with vLLM it does nothing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

FAULT_DIR_ENV = "MERIDIAN_TEST_FAULT_DIR"

logger = logging.getLogger(__name__)


def install_test_fault(model: str, engine: Any) -> bool:
    """Arm the fault for `model`'s engine when the environment asks for it; True if armed."""
    folder = os.environ.get(FAULT_DIR_ENV)
    runner = getattr(getattr(engine, "engine", None), "runner", None)
    if not folder or runner is None:
        return False
    trigger = Path(folder) / model.replace("/", "_")
    network = runner.model
    healthy = network.lm_head_linear

    def lm_head(x: Any) -> Any:
        logits = healthy(x)
        return logits.roll(1, dims=-1) if trigger.exists() else logits

    network.lm_head_linear = lm_head
    logger.warning("TEST FAULT armed for %s: its logits go wrong while %s exists", model, trigger)
    return True
