"""`meridian up`: a whole federation on one machine — nodes in two jurisdictions and a gateway."""

from meridian.federation.plan import FederationPlan, NodeSpec, plan_federation
from meridian.federation.up import up_main

__all__ = ["FederationPlan", "NodeSpec", "plan_federation", "up_main"]
