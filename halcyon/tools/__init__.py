"""The operator tools: the ``halcyon`` command and its subcommands (:mod:`halcyon.tools.cli`).

The top layer: these modules compose the service packages (``controller``, ``gateway``,
``worker``) and the benchmarks (``bench``); nothing below imports them.
"""
