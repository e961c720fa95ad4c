"""Admission: tier-aware load shedding against a time-to-first-token target, before quota and
before any upstream call (gateway/README.md, "Overload")."""

from gateway.admission.controller import AdmissionController, Admitted, Ticket
from gateway.admission.errors import Overloaded, ShedReason

__all__ = ["AdmissionController", "Admitted", "Overloaded", "ShedReason", "Ticket"]
