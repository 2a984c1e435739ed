"""The Halcyon controller: fleet registry, routing table, outcome evidence, store, operator API.

Policy and state (``registry``, ``routing_table``, ``stable_versions``, ``outcomes``,
``rollout_requests``) are pure and clock-injected; ``fleet``, ``servicer``, ``event_writer``
and ``app`` are the asyncio/gRPC shell around them; ``main`` is ``halcyon controller``.
"""
