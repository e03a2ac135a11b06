"""Liveness is authenticated: node 0 counts a peer alive only on a sealed beat of that peer,
newer than the last one it saw. Bumped, forged, replayed, copied or deleted beats keep no dead
peer alive (and say why it may look silent)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from agent.node.membership import Beats, Membership
from agent.node.store import Endpoint, Store
from agent.node.store_client import StoreClient
from agent.node.trust import JobKeys

KEYS = JobKeys.derive(b"beat-test", "job", "0")
NAMES = ("ns/hb/0", "ns/hb/1")


def beat(index: int, seq: int, key: str | None = None) -> bytes:
    return KEYS.seal({"i": index, "seq": seq}, key or NAMES[index])


GENUINE = beat(1, 10)


@pytest.mark.parametrize(
    ("second", "seq", "why"),
    [
        (beat(1, 11), 11, ""),  # a newer beat: alive
        (GENUINE, 10, ""),  # unchanged bytes: nothing new, nothing wrong
        (b"11", 10, "does not open"),  # a counter bumped by an outsider
        (b"garbage", 10, "does not open"),
        (JobKeys.derive(b"other", "job", "0").seal({"i": 1, "seq": 99}, NAMES[1]), 10, "open"),
        (beat(0, 99, NAMES[1]), 10, "replay"),  # sealed for its key, but names another sender
        (beat(1, 99, NAMES[0]), 10, "does not open"),  # node 0's key's beat copied here
        (beat(1, 9), 10, "replay"),  # an older genuine beat written back
        (b"", 10, "deleted"),  # the key deleted (torch's server reads it as empty)
    ],
    # sealed values are random: ids that do not name them, so every collection (each pytest-xdist
    # worker's) finds the same tests
    ids=["newer", "same", "bumped", "garbage", "other-key", "sender", "copied", "older", "gone"],
)
def test_only_a_newer_sealed_beat_of_the_peer_counts(second, seq, why) -> None:
    beats = Beats(KEYS, NAMES)
    assert beats.read([b"", GENUINE]) == [0, 10]
    if second == GENUINE:
        assert beats.read([b"", second]) == [0, 10] and beats.tampered[1] == ""
        return
    assert beats.read([b"", second])[1] == seq
    assert (why in beats.tampered[1]) if why else beats.tampered[1] == ""


def test_a_replayed_beat_after_a_forgery_still_does_not_count() -> None:
    beats = Beats(KEYS, NAMES)
    beats.read([b"", GENUINE])
    beats.read([b"", b"junk"])
    assert beats.read([b"", GENUINE]) == [0, 10]  # the same old bytes, back again


def test_a_stopped_peer_is_named_though_an_outsider_bumps_forges_and_replays_its_beat() -> None:
    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    endpoint = Endpoint("127.0.0.1", server.port)

    def member(index: int) -> Membership:
        store = Store(StoreClient.connect("127.0.0.1", server.port, 10), endpoint, "hb/")
        return Membership(store, 2, index, ["n0", "n1"], KEYS)

    stops = [threading.Event(), threading.Event()]
    peer = member(1)
    peer.heartbeat(stops[1], 0.02, 0.5, lambda why: None, None)
    key = peer.store.key("hb", 1)
    outsider = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
    silent: list[int] = []
    named = threading.Event()

    def on_silent(index: int) -> None:
        silent.append(index)
        named.set()

    member(0).heartbeat(stops[0], 0.02, 0.5, lambda why: None, on_silent)
    recorded = bytes(outsider.get(key))  # a genuine beat, recorded for replay
    stops[1].set()  # the peer stops beating
    rounds = 0
    while not named.is_set():  # the outsider keeps its key moving, every way it can
        outsider.set(key, [b"1", b"garbage", recorded][rounds % 3])
        if rounds % 3 == 0:
            outsider.add(key, 1)
        rounds += 1
        assert rounds < 200_000, "node 0 never named the stopped peer"
    stops[0].set()
    assert silent == [1] and rounds > 3
