"""Halcyon: a control plane for ML inference fleets.

This package holds the ``halcyon`` command (``halcyon.cli``), the process entry points that
compose the service packages, and the generated gRPC stubs (``halcyon.v1``).
"""

__version__ = "0.1.0"
