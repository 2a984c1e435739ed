"""One gRPC channel per replica address, opened when a replica joins and closed when it leaves.

Channels are long-lived HTTP/2 connections; opening one per batch would cost more than the
batch. A channel of a replica that left is closed after a grace period so batches already
dispatched to it can still answer.

The pool follows membership by the owner's change events (:mod:`gateway.replicas`): it
holds, per replica, the record it was last handed and the channel dialed to its address —
the channel is the pool's own state, the address is read from the record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc

from common import keepalive
from gateway.replicas import Change, Insert, ReplicaInfo
from halcyon.v1 import worker_pb2_grpc

CLOSE_GRACE_S = 30.0


class WorkerPool:
    """Stubs for the replicas a gateway may dispatch to, keyed by replica id."""

    def __init__(
        self,
        credentials: grpc.ChannelCredentials | None = None,
        interceptors: Sequence[Any] = (),
    ) -> None:
        self._credentials = credentials
        self._interceptors = list(interceptors)
        self._channels: dict[str, tuple[ReplicaInfo, grpc.aio.Channel]] = {}
        self._stubs: dict[str, worker_pb2_grpc.WorkerServiceStub] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def changed(self, change: Change) -> None:
        """A membership change: a joining replica's channel opens, a leaving one's closes."""
        if isinstance(change, Insert):
            self._open(change.replica)
        else:
            self._close(change.replica.replica_id)

    def members(self) -> dict[str, ReplicaInfo]:
        """Replica id -> the record its open channel was dialed for."""
        return {rid: replica for rid, (replica, _channel) in self._channels.items()}

    def _open(self, replica: ReplicaInfo) -> None:
        replica_id, address = replica.replica_id, replica.address
        current = self._channels.get(replica_id)
        if current is not None and current[0].address == address:
            self._channels[replica_id] = (replica, current[1])
            return
        if current is not None:
            self._close(replica_id)
        options = [
            # Pings a batch's connection however long the batch runs; the worker's server
            # accepts them (common.keepalive), so a 35 s batch is not cut by too_many_pings.
            *keepalive.client_options(),
            ("grpc.max_receive_message_length", 64 << 20),
            # The dispatcher retries (elsewhere, with the batcher's say) itself; the core's
            # transparent retries would only buffer every batch a second time.
            ("grpc.enable_retries", 0),
        ]
        if self._credentials is None:
            channel = grpc.aio.insecure_channel(
                address, options=options, interceptors=self._interceptors
            )
        else:
            channel = grpc.aio.secure_channel(
                address, self._credentials, options=options, interceptors=self._interceptors
            )
        self._channels[replica_id] = (replica, channel)
        self._stubs[replica_id] = worker_pb2_grpc.WorkerServiceStub(channel)

    def stub(self, replica_id: str) -> worker_pb2_grpc.WorkerServiceStub | None:
        return self._stubs.get(replica_id)

    def _close(self, replica_id: str) -> None:
        entry = self._channels.pop(replica_id, None)
        self._stubs.pop(replica_id, None)
        if entry is None:
            return
        task = asyncio.create_task(self._close_later(entry[1], CLOSE_GRACE_S))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close_later(channel: grpc.aio.Channel, grace_s: float) -> None:
        await asyncio.sleep(grace_s)
        await channel.close()

    async def close_all(self) -> None:
        for task in list(self._closing):
            task.cancel()
        channels = [ch for _replica, ch in self._channels.values()]
        self._channels.clear()
        self._stubs.clear()
        await asyncio.gather(*(ch.close() for ch in channels), return_exceptions=True)
