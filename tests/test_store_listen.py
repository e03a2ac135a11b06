"""Where node 0's job store listens: MASTER_ADDR's own address when that is safe, else everywhere."""

from __future__ import annotations

import errno
import socket

import pytest

from agent.node.store import Endpoint, _listener


@pytest.mark.parametrize(
    ("addr", "bound"),
    [
        ("127.0.0.1", "127.0.0.1"),  # an address literal of this host: only there
        ("127.0.0.3", "127.0.0.3"),
        ("localhost", None),  # a name that resolves to loopback here (Debian's 127.0.1.1 case)
    ],
)
def test_the_store_binds_the_master_address_only_when_it_is_safe(addr, bound):
    listener = _listener(Endpoint(addr, 0))
    try:
        assert (None if listener is None else listener.getsockname()[0]) == bound
    finally:
        if listener is not None:
            listener.close()


def test_a_taken_port_is_an_error_not_a_silent_fallback():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(OSError) as excinfo:
            _listener(Endpoint("127.0.0.1", taken.getsockname()[1]))
        assert excinfo.value.errno == errno.EADDRINUSE
    finally:
        taken.close()
