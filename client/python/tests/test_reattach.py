"""A daemon killed and started again: reattach() and auto_reattach keep the same client objects working."""

import asyncio
import time

import pytest

from framelink import Consumer, FrameLinkError, Producer, Status, pattern
from framelink_daemons import DaemonPair

SIZE = 64 * 1024


@pytest.fixture
def own_pair():
    p = DaemonPair()
    yield p
    p.stop()


def send(producer, frame_id, length):
    with producer.acquire(timeout=10) as loan:
        loan.write(pattern.payload(frame_id, length))
        loan.submit(frame_id=frame_id)


def kill_a(pair, client):
    pair.a.kill()
    deadline = time.monotonic() + 5
    while True:
        try:
            client.check_daemon()
        except FrameLinkError as e:
            assert e.status == Status.ERR_DAEMON_GONE
            return
        assert time.monotonic() < deadline, "the client did not notice that its daemon was killed"
        time.sleep(0.01)


def test_auto_reattach_carries_on_after_the_daemon_restarts(own_pair):
    pair = own_pair
    with Consumer("py-auto", socket_path=pair.b.socket, slot_count=4, slot_size=SIZE) as consumer, \
            Producer("py-auto", socket_path=pair.a.socket, slot_count=4, slot_size=SIZE) as producer:
        assert producer.auto_reattach  # on by default: the application did not ask for it
        pid_before = producer.info.daemon_pid
        send(producer, 1, 1000)  # in flight: the consumer holds it
        held = consumer.receive(timeout=10)
        assert held is not None and held.frame_id == 1
        loan = producer.acquire(timeout=5)  # held by the application

        kill_a(pair, producer)
        # While no daemon is there: no slot, no exception; frame 1, in flight, ends as unknown.
        assert producer.try_acquire() is None
        done = producer.poll_completions()
        assert [(c.frame_id, c.status) for c in done] == [(1, Status.ERR_DAEMON_GONE)]
        assert producer.generation == 0

        async def acquire_after_restart():
            task = asyncio.ensure_future(producer.acquire_async())
            await asyncio.sleep(0.2)
            assert not task.done()
            pair.restart_a()
            return await asyncio.wait_for(task, 30)

        fresh = asyncio.run(acquire_after_restart())
        assert producer.generation == 1
        assert producer.info.daemon_pid != pid_before
        fresh.abandon()

        # The loan of the old attachment is void; abandoning it is harmless.
        with pytest.raises(FrameLinkError) as e:
            loan.buffer()
        assert e.value.status == Status.ERR_DAEMON_GONE
        loan.abandon()

        # Exactly one completion for frame 1: nothing more after the reattach.
        assert producer.poll_completions() == []

        held.release()
        send(producer, 2, 2000)
        with consumer.receive(timeout=20) as f:
            assert f.frame_id == 2
            assert pattern.mismatch(2, f.ndarray()) == -1
        done = producer.wait_completions(timeout=20)
        assert [(c.frame_id, c.delivered) for c in done] == [(2, True)]


def test_reattach_with_one_call(own_pair):
    pair = own_pair
    with Consumer("py-manual", socket_path=pair.a.socket, slot_count=2, slot_size=SIZE, auto_reattach=False) as consumer:
        consumer.reattach()  # still served: nothing changes
        assert consumer.generation == 0
        kill_a(pair, consumer)
        with pytest.raises(FrameLinkError) as e:
            consumer.try_receive()
        assert e.value.status == Status.ERR_DAEMON_GONE
        with pytest.raises(FrameLinkError) as e:
            consumer.reattach()  # nobody listening yet
        assert e.value.status == Status.ERR_DAEMON_UNREACHABLE
        pair.restart_a()
        consumer.reattach()
        assert consumer.generation == 1
        consumer.check_daemon()
        assert consumer.try_receive() is None


def test_an_asyncio_waiter_learns_of_the_daemons_loss_from_the_doorbell(own_pair):
    # No polling of the daemon: the doorbell fd itself becomes readable when the daemon dies.
    pair = own_pair
    with Consumer("py-loss", socket_path=pair.a.socket, slot_count=2, slot_size=SIZE, auto_reattach=False) as consumer:
        fd = consumer.fileno()

        async def receive_while_the_daemon_dies():
            task = asyncio.ensure_future(consumer.receive_async())
            await asyncio.sleep(0.2)
            assert not task.done()
            pair.a.kill()
            with pytest.raises(FrameLinkError) as e:
                await asyncio.wait_for(task, 5)
            return e.value.status

        assert asyncio.run(receive_while_the_daemon_dies()) == Status.ERR_DAEMON_GONE
        pair.restart_a()
        consumer.reattach()
        assert consumer.fileno() == fd  # the same fd, watching the new attachment
        assert consumer.generation == 1


def test_a_daemon_back_refusing_for_good_ends_auto_reattach(own_pair):
    pair = own_pair
    with Producer("py-shrunk", socket_path=pair.a.socket, slot_count=2, slot_size=SIZE,
                  reattach_interval_ms=20) as producer:
        assert producer.auto_reattach
        kill_a(pair, producer)
        pair.restart_a(["--max-slot-size", "4096"])  # smaller than the slots this producer asks for
        # The call that meets the refusal raises it once, with the daemon's reason...
        with pytest.raises(FrameLinkError) as e:
            producer.acquire(timeout=20)
        assert e.value.status == Status.ERR_LIMIT
        assert "max_slot_size" in str(e.value)
        # ...and later calls say the daemon dropped it for good, at once.
        started = time.monotonic()
        with pytest.raises(FrameLinkError) as e:
            producer.acquire(timeout=5)
        assert e.value.status == Status.ERR_DAEMON_GONE
        assert "FL_ERR_LIMIT" in str(e.value)
        assert time.monotonic() - started < 4
