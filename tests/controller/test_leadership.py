"""Leader election on a real PostgreSQL server (controller.leadership).

Two :class:`Leadership` objects on one database: exactly one leads; when the leader's lock
session ends the other leads within a second, with a higher epoch; a standby knows the
leader's advertised address. One server per module, a fresh database per test.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from controller.leadership import Leadership
from controller.store import ControllerStore
from controller.store_url import parse_store_location
from tests.support.postgres import PostgresCluster, postgres_cluster
from tests.support.tools import require_tool


@pytest.fixture(scope="module")
def pg_cluster() -> Iterator[PostgresCluster]:
    with postgres_cluster(require_tool("initdb"), require_tool("pg_ctl")) as cluster:
        yield cluster


@pytest.fixture
def url(pg_cluster: PostgresCluster) -> str:
    location = pg_cluster.create_database()
    ControllerStore(location).close()  # migrated: the leader table exists
    return location


def test_exactly_one_leads_and_the_standby_knows_where(url: str) -> None:
    first = Leadership(parse_store_location(url), "10.0.0.1:50050")
    second = Leadership(parse_store_location(url), "10.0.0.2:50050")
    try:
        assert first.try_acquire()
        assert not second.try_acquire()
        assert not second.try_acquire()
        assert first.leading and not second.leading
        assert first.epoch == 1
        assert second.leader_address == "10.0.0.1:50050"
        assert first.alive()
        assert first._connected().execute("SHOW tcp_keepalives_idle").fetchone() == ("2",)
    finally:
        first.close()
        second.close()


async def test_the_standby_leads_within_a_second_of_the_leader_session_ending(url: str) -> None:
    first = Leadership(parse_store_location(url), "a:1")
    second = Leadership(parse_store_location(url), "b:2", retry_s=0.1)
    try:
        assert first.try_acquire()
        epoch = first.epoch
        assert epoch is not None
        waiting = asyncio.create_task(second.acquire())
        await asyncio.sleep(0.3)
        assert not waiting.done()
        lost_at = time.monotonic()
        first.close()  # the session ends: PostgreSQL frees the lock
        new_epoch = await asyncio.wait_for(waiting, timeout=1.0)
        assert time.monotonic() - lost_at < 1.0
        assert new_epoch > epoch
        assert second.leader_address == "b:2"
        assert not first.alive()
    finally:
        first.close()
        second.close()


async def test_watch_reports_a_lost_lock_session(url: str) -> None:
    leader = Leadership(parse_store_location(url), "a:1", check_s=0.05)
    try:
        assert leader.try_acquire()
        lost = asyncio.Event()
        watching = asyncio.create_task(leader.watch(lost.set))
        await asyncio.sleep(0.2)
        assert not lost.is_set()
        leader._drop()  # the connection is gone, as when the server or the network fails
        await asyncio.wait_for(lost.wait(), timeout=1.0)
        await watching
    finally:
        leader.close()


def test_an_unreachable_store_is_a_failed_attempt() -> None:
    location = parse_store_location("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    leadership = Leadership(location, "a:1")
    assert not leadership.try_acquire()
    assert not leadership.leading
