"""Halcyon: a control plane for ML inference fleets.

This package is two layers that only meet here by name:

* the generated gRPC stubs, ``halcyon.v1`` (Halcyon's own API) and ``halcyon.oip`` (the Open
  Inference Protocol) — the floor every service package imports, importing nothing of ours;
* the operator tools, ``halcyon.tools`` — the ``halcyon`` command (:mod:`halcyon.tools.cli`)
  and its subcommands, the roof that composes the service packages.

``tests/contracts/test_import_rules.py`` keeps the two apart.
"""

__version__ = "0.1.0"
