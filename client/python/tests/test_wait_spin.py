"""The host's wait spin: the daemon's client_wait_spin_us, the wait_spin_us property, and the *_async calls
that take what comes within the spin without awaiting the doorbell."""

import asyncio
import tempfile
import threading
import time

import pytest

from framelink import Consumer, Producer
from framelink_daemons import Daemon

ADVISED = 333
# Far longer than the 20 ms the frame takes to come, so that a slow machine still sees it within the spin.
LONG_SPIN = 1_000_000
LATER = 0.02


@pytest.fixture(scope="module")
def daemon():
    with tempfile.TemporaryDirectory(prefix="fl-py-spin.") as d:
        daemon = Daemon(d, "spin", ["--log-level", "warn", "--client-wait-spin-us", str(ADVISED)])
        yield daemon
        assert daemon.stop() == 0


def opts(daemon, spin=0, slots=2):
    return dict(socket_path=daemon.socket, slot_count=slots, slot_size=4096, wait_spin_us=spin)


def later(action):
    """Runs action() on a thread LATER seconds from now."""
    def run():
        time.sleep(LATER)
        action()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def send(p, frame_id):
    with p.acquire(timeout=10) as loan:
        loan.write(b"x" * 64)
        loan.submit(frame_id=frame_id)


def receive_and_release(c):
    f = c.receive(timeout=10)
    assert f is not None
    f.release()


def test_wait_spin_us_is_the_argument_else_the_daemons_advice(daemon, stream):
    with Consumer(stream, **opts(daemon)) as c:
        assert c.wait_spin_us == ADVISED
    with Consumer(stream, **opts(daemon, spin=5)) as c:
        assert c.wait_spin_us == 5
    with Producer(stream, **opts(daemon, spin=-1)) as p:
        assert p.wait_spin_us == 0


def test_receive_async_takes_a_frame_within_the_spin_without_the_doorbell(daemon, stream):
    with Consumer(stream, **opts(daemon, spin=LONG_SPIN)) as c, Producer(stream, **opts(daemon)) as p:
        assert c.try_receive() is None
        t = later(lambda: send(p, 7))
        f = asyncio.run(c.receive_async())
        t.join(10)
        with f:
            assert f.frame_id == 7
        assert c._doorbell_waits == 0


def test_without_a_spin_receive_async_awaits_the_doorbell(daemon, stream):
    with Consumer(stream, **opts(daemon, spin=-1)) as c, Producer(stream, **opts(daemon)) as p:
        t = later(lambda: send(p, 8))
        f = asyncio.run(asyncio.wait_for(c.receive_async(), 10))
        t.join(10)
        with f:
            assert f.frame_id == 8
        assert c._doorbell_waits >= 1


def test_acquire_async_and_completions_async_spin_too(daemon, stream):
    with Consumer(stream, **opts(daemon)) as c, Producer(stream, **opts(daemon, spin=LONG_SPIN, slots=1)) as p:
        send(p, 9)
        t = later(lambda: receive_and_release(c))
        got = asyncio.run(p.completions_async())  # the frame's, once the consumer releases it
        t.join(10)
        assert [(x.frame_id, x.delivered) for x in got] == [(9, True)]
        send(p, 10)
        t = later(lambda: receive_and_release(c))
        loan = asyncio.run(p.acquire_async())  # the one slot, back once frame 10 is released
        t.join(10)
        loan.abandon()
        assert p._doorbell_waits == 0
