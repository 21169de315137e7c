"""Producer -> framelinkd a -> framelinkd b -> consumer, through real daemons and shared memory."""

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import framelink
from framelink import Consumer, FrameLinkError, Producer, Status, pattern
from framelink_daemons import DaemonPair


SIZE = 64 * 1024


def consume(pair, stream, count, out, slots=4):
    with Consumer(stream, socket_path=pair.b.socket, slot_count=slots, slot_size=SIZE) as c:
        out["attached"].set()
        for _ in range(count):
            f = c.receive(timeout=20)
            if f is None:
                out["error"] = "timed out waiting for a frame"
                return
            with f:
                view = f.ndarray()
                out["frames"].append((f.frame_id, f.group_id, f.timestamp_ns, f.attributes, f.length,
                                      pattern.mismatch(f.frame_id, view), view.flags.writeable, f.has_crc32c))
                del view


def start_consumer(pair, stream, count):
    out = {"frames": [], "error": None, "attached": threading.Event()}
    t = threading.Thread(target=consume, args=(pair, stream, count, out), daemon=True)
    t.start()
    assert out["attached"].wait(10)
    return t, out


def test_round_trip_every_byte_and_field(pair, stream):
    n = 12
    t, out = start_consumer(pair, stream, n)
    sent = {}
    with Producer(stream, socket_path=pair.a.socket, slot_count=4, slot_size=SIZE) as p:
        assert p.slot_size >= SIZE and p.slot_count == 4
        done = []
        for i in range(n):
            length = SIZE - 8 * i - (i % 3)
            with p.acquire(timeout=20) as loan:
                if i % 2:
                    loan.ndarray(length)[:] = pattern.payload(i, length)  # in place, zero copies
                    kw = {"length": length}
                else:
                    assert loan.write(pattern.payload(i, length)) == length  # one copy
                    kw = {}
                ts = time.time_ns()
                loan.submit(**kw, frame_id=i, group_id=pattern.wafer_of(i), timestamp_ns=ts,
                            attributes=pattern.attributes(i), crc=(i == 3))
                sent[i] = (length, ts)
            done += p.poll_completions()
        while len(done) < n:
            got = p.wait_completions(timeout=20)
            assert got, "no completion within 20 s"
            done += got
        assert p.in_flight == 0
    t.join(20)
    assert out["error"] is None
    assert sorted(c.frame_id for c in done) == list(range(n))
    assert all(c.delivered and c.status == Status.OK for c in done), [c.reason for c in done if not c.delivered]
    assert all(c.length == sent[c.frame_id][0] for c in done)
    assert [f[0] for f in out["frames"]] == list(range(n))
    for fid, wafer, ts, attrs, length, bad, writeable, has_crc in out["frames"]:
        assert (wafer, ts, attrs, length) == (pattern.wafer_of(fid), sent[fid][1], pattern.attributes(fid),
                                              sent[fid][0])
        assert bad == -1, f"frame {fid} differs from the pattern at byte {bad}"
        assert writeable is False
        assert has_crc == (fid == 3)


def test_view_lifetime_guard(pair, stream):
    t, out = start_consumer(pair, stream, 1)
    with Producer(stream, socket_path=pair.a.socket, slot_count=2, slot_size=SIZE) as p:
        loan = p.acquire(timeout=10)
        view = loan.ndarray((256, 256))
        tail = view[100:][::3]  # a derived view keeps the slot too
        del view
        view2 = loan.buffer()[10:20]
        with pytest.raises(BufferError, match="still alive"):
            loan.submit(SIZE, frame_id=0)
        del view2
        with pytest.raises(BufferError):
            loan.abandon()
        assert not loan.submitted_or_abandoned
        del tail
        loan.write(pattern.payload(0, SIZE))
        loan.submit(frame_id=0, group_id=0, attributes=pattern.attributes(0))
        with pytest.raises(ValueError, match="already submitted"):
            loan.buffer()
        with pytest.raises(ValueError, match="already submitted"):
            loan.submit(SIZE, frame_id=0)
        assert p.wait_completions(timeout=20)[0].delivered
    t.join(20)
    assert out["frames"][0][5] == -1


def test_consumer_views_are_read_only_and_guard_release(pair, stream):
    with Consumer(stream, socket_path=pair.b.socket, slot_count=2, slot_size=SIZE) as c, \
         Producer(stream, socket_path=pair.a.socket, slot_count=2, slot_size=SIZE) as p:
        with p.acquire(timeout=10) as loan:
            loan.write(b"\x07" * 100)
            loan.submit(frame_id=5)
        f = c.receive(timeout=20)
        assert f is not None and f.length == 100
        a = f.ndarray()
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a[0] = 1
        mv = f.buffer()
        assert mv.readonly and mv[99] == 7
        with pytest.raises(TypeError):
            mv[0] = 1
        with pytest.raises(BufferError, match="release the frame"):
            f.release()
        del a, mv
        f.release()
        with pytest.raises(ValueError, match="already released"):
            f.buffer()
        assert p.wait_completions(timeout=20)[0].delivered


def test_bad_input_says_what_to_do(pair, stream, tmp_path):
    with pytest.raises(FrameLinkError) as e:
        Producer(stream, socket_path=str(tmp_path / "nothing.sock"))
    assert e.value.status == Status.ERR_DAEMON_UNREACHABLE
    assert "nothing.sock" in str(e.value)
    with pytest.raises(FrameLinkError) as e:
        Producer("bad name!", socket_path=pair.a.socket)
    assert e.value.status in (Status.ERR_BAD_REQUEST, Status.EINVAL)
    with Producer(stream, socket_path=pair.a.socket, slot_count=1, slot_size=SIZE) as p:
        with p.acquire(timeout=10) as loan:
            with pytest.raises(ValueError, match="at most 192"):
                loan.submit(1, frame_id=1, attributes=b"x" * 193)
            with pytest.raises(ValueError, match="do not fit"):
                loan.write(b"x" * (p.slot_size + 1))
            with pytest.raises(ValueError, match="outside the slot"):
                loan.submit(p.slot_size + 1, frame_id=1)
        # the context manager abandoned the loan: the only slot is free again
        assert p.try_acquire() is not None
        with pytest.raises(framelink.FrameLinkTimeout):
            p.acquire(timeout=0.05)  # the one slot is held by the loan above (never submitted)


CTRL_C_CHILD = r"""
import signal, sys, framelink
# A shell that starts the tests in the background makes them ignore SIGINT,
# and Python keeps an inherited SIG_IGN: restore what an interactive run has.
signal.signal(signal.SIGINT, signal.default_int_handler)
c = framelink.Consumer(sys.argv[2], socket_path=sys.argv[1])
print("waiting", flush=True)
try:
    c.receive()
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(42)
"""


def test_ctrl_c_interrupts_a_blocking_receive(pair, stream):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed framelink, as here
    child = subprocess.Popen([sys.executable, "-c", CTRL_C_CHILD, pair.b.socket, stream], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.3)  # now inside receive()
        t0 = time.monotonic()
        child.send_signal(signal.SIGINT)
        rc = child.wait(5)
        elapsed = time.monotonic() - t0
    finally:
        if child.poll() is None:
            child.kill()
    out, err = child.communicate()
    assert rc == 42, err
    assert "interrupted" in out
    assert elapsed < 2.0


def test_asyncio_round_trip_and_cancellation(pair, stream):
    n = 10

    async def main():
        with Consumer(stream, socket_path=pair.b.socket, slot_count=4, slot_size=SIZE) as c, \
             Producer(stream, socket_path=pair.a.socket, slot_count=2, slot_size=SIZE) as p:
            # A receive on an idle stream waits on the doorbell and can be cancelled.
            idle = asyncio.ensure_future(c.receive_async())
            await asyncio.sleep(0.2)
            assert not idle.done()
            idle.cancel()
            with pytest.raises(asyncio.CancelledError):
                await idle

            async def produce():
                for i in range(n):
                    loan = await p.acquire_async()  # only 2 slots: waits for completions
                    loan.write(pattern.payload(i, 1000 + i))
                    loan.submit(frame_id=i, group_id=pattern.wafer_of(i))

            async def collect():
                got = []
                async for comp in p.completions():
                    got.append(comp)
                    if len(got) == n:
                        return got

            async def receive():
                seen = []
                async for f in c.frames():
                    with f:
                        seen.append((f.frame_id, f.length, pattern.mismatch(f.frame_id, f.buffer())))
                    if len(seen) == n:
                        return seen

            _, comps, seen = await asyncio.wait_for(asyncio.gather(produce(), collect(), receive()), 30)
            assert [x.frame_id for x in comps] == list(range(n)) and all(x.delivered for x in comps)
            assert seen == [(i, 1000 + i, -1) for i in range(n)]
            assert not c._waiters and c._reader_loop is None

    asyncio.run(main())


def test_async_with_closes_and_wakes_the_tasks_waiting_on_the_client(pair, stream):
    async def main():
        async with Consumer(stream, socket_path=pair.b.socket, slot_count=2, slot_size=SIZE) as c:
            waiting = [asyncio.ensure_future(c.receive_async()) for _ in range(2)]
            await asyncio.sleep(0.1)
            assert not any(w.done() for w in waiting) and c._reader_loop is not None
        # Leaving the block detached the consumer: its waiters are told so at once, and the loop no
        # longer watches the closed doorbell fd (whose number the next open may reuse).
        for w in waiting:
            with pytest.raises(ValueError, match="closed"):
                await asyncio.wait_for(w, 3)
        assert c._reader_loop is None and not c._waiters
        with pytest.raises(ValueError, match="closed"):
            c.fileno()
        c.close()  # a second close does nothing

    asyncio.run(main())


def test_a_client_closed_from_another_thread_wakes_its_waiting_task(pair, stream):
    async def main():
        c = Consumer(stream, socket_path=pair.b.socket, slot_count=2, slot_size=SIZE)
        waiting = asyncio.ensure_future(c.receive_async())
        await asyncio.sleep(0.1)
        closer = threading.Thread(target=c.close)
        closer.start()
        with pytest.raises(ValueError, match="closed"):
            await asyncio.wait_for(waiting, 3)
        closer.join()
        assert c._reader_loop is None and not c._waiters

    asyncio.run(main())


def test_crc32c_known_value():
    assert framelink.crc32c(b"123456789") == 0xE3069283


def test_frames_from_the_c_cli_match_the_python_pattern(pair, stream):
    cli = os.path.join(os.path.dirname(os.environ["FRAMELINKD"]), "..", "client", "cli", "framelink")
    t, out = start_consumer(pair, stream, 3)
    r = subprocess.run([cli, "send", "--socket", pair.a.socket, "--stream", stream, "--count", "3", "--size",
                        str(SIZE - 3), "--slots", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    t.join(20)
    assert [(f[0], f[1], f[3], f[4], f[5]) for f in out["frames"]] == [
        (i, pattern.wafer_of(i), pattern.attributes(i), SIZE - 3, -1) for i in range(3)]


def test_local_subscriber_and_queue_group_read_the_producers_slot(pair, stream):
    """One daemon: the subscriber gets each frame, the queue group shares them, nothing is copied."""
    sock = pair.a.socket
    with Consumer(stream, socket_path=sock, slot_count=4, subscribe=True) as sub, \
            Consumer(stream, socket_path=sock, slot_count=4) as m1, \
            Consumer(stream, socket_path=sock, slot_count=4) as m2, \
            Producer(stream, socket_path=sock, slot_count=4, slot_size=SIZE) as p:
        shared = {id(m1): 0, id(m2): 0}
        for i in range(10):
            payload = bytes(pattern.payload(i, 1000 + i))
            with p.acquire(timeout=20) as loan:
                loan.write(payload)
                loan.submit(frame_id=i, crc=True)
            f = sub.receive(timeout=20)
            assert f is not None and f.frame_id == i and f.has_crc32c
            assert f.buffer().tobytes() == payload
            with pytest.raises(ValueError):
                f.ndarray()[0] = 1  # read-only
            member = None
            for m in (m1, m2):
                g = m.receive(timeout=1 if member is None else 0)
                if g is not None:
                    assert member is None, f"frame {i} went to two queue group members"
                    member = (m, g)
            assert member is not None, f"no queue group member got frame {i}"
            assert member[1].buffer().tobytes() == payload
            shared[id(member[0])] += 1
            assert p.wait_completions(timeout=0.2) == [], "DELIVERED only once every reader released it"
            f.release()
            assert p.wait_completions(timeout=0.2) == []
            member[1].release()
            done = p.wait_completions(timeout=20)
            assert [(c.frame_id, c.delivered, c.readers, c.released) for c in done] == [(i, True, 2, 2)]
        assert shared == {id(m1): 5, id(m2): 5}


def test_a_stalled_subscriber_of_a_drop_stream_is_skipped_and_told_the_gap():
    """drop_streams: the fast subscriber and the producer go on, the stalled one's next frame says what it missed."""
    drop = DaemonPair(extra_args=["--drop-stream", "py-drop", "--drop-lag", "1"])
    try:
        sock = drop.a.socket
        with Consumer("py-drop", socket_path=sock, slot_count=1, subscribe=True) as slow, \
                Consumer("py-drop", socket_path=sock, slot_count=8, subscribe=True) as fast, \
                Producer("py-drop", socket_path=sock, slot_count=8, slot_size=SIZE) as p:
            def send(i):
                with p.acquire(timeout=20) as loan:
                    loan.write(bytes(pattern.payload(i, 100)))
                    loan.submit(frame_id=i)

            # fast has a slot for every frame: a release the daemon has not taken yet never leaves it
            # full (and so skipped too) while the frames below wait.
            send(0)
            held = slow.receive(timeout=20)  # its only slot, kept
            assert held is not None and held.gap == 0
            first = fast.receive(timeout=20)
            assert first is not None
            first.release()
            for i in range(1, 6):
                send(i)
            # More than one frame waiting for it: it is skipped for frames 1 .. 4, frame 5 waits.
            for i in range(1, 5):
                f = fast.receive(timeout=20)
                assert f is not None and (f.frame_id, f.gap) == (i, 0)
                f.release()
            held.release()
            f = slow.receive(timeout=20)
            assert f is not None and (f.frame_id, f.gap) == (5, 4)
            f.release()
            f = fast.receive(timeout=20)
            assert f is not None and (f.frame_id, f.gap) == (5, 0)
            f.release()
            done = []
            while len(done) < 6:
                got = p.wait_completions(timeout=20)
                assert got, f"completions of frames 0 .. 5, got {done}"
                done += [(c.frame_id, c.delivered, c.readers, c.skipped) for c in got]
            # Each meant for both; the completion names the subscriber skipped for frames 1 .. 4.
            assert sorted(done) == [(0, True, 2, 0), (1, True, 2, 1), (2, True, 2, 1), (3, True, 2, 1),
                                    (4, True, 2, 1), (5, True, 2, 0)]
    finally:
        assert drop.stop() == [0, 0]


def test_remote_subscribers_each_get_every_frame(pair, stream):
    """Two subscribers on the other host: each frame crosses the link once, both read it, and the
    completion says both released it."""
    with Consumer(stream, socket_path=pair.b.socket, slot_count=4, subscribe=True) as s1, \
            Consumer(stream, socket_path=pair.b.socket, slot_count=4, subscribe=True) as s2, \
            Producer(stream, socket_path=pair.a.socket, slot_count=4, slot_size=SIZE) as p:
        for i in range(6):
            payload = bytes(pattern.payload(i, 3000 + i))
            with p.acquire(timeout=20) as loan:
                loan.write(payload)
                loan.submit(frame_id=i, crc=True)
            for reader in (s1, s2):
                f = reader.receive(timeout=20)
                assert f is not None and f.frame_id == i
                assert f.buffer().tobytes() == payload
                f.release()
            done = p.wait_completions(timeout=20)
            assert [(c.frame_id, c.delivered, c.readers, c.released) for c in done] == [(i, True, 2, 2)]


def test_a_producer_cannot_subscribe(pair, stream):
    with pytest.raises(TypeError):
        Producer(stream, socket_path=pair.a.socket, subscribe=True)
    with pytest.raises(TypeError):
        Producer(stream, socket_path=pair.a.socket, pull=True)  # the consumer's host decides


def test_wait_spin_us_is_passed_through_and_checked(pair, stream):
    with pytest.raises(ValueError, match="wait_spin_us"):
        Consumer(stream, socket_path=pair.b.socket, wait_spin_us=-2)
    with pytest.raises(FrameLinkError, match="wait_spin_us is 1000001"):
        Consumer(stream, socket_path=pair.b.socket, wait_spin_us=1_000_001)
    # No spin on one side, a long one on the other: frames move either way.
    with Consumer(stream, socket_path=pair.b.socket, slot_count=4, slot_size=SIZE, wait_spin_us=-1) as c, \
            Producer(stream, socket_path=pair.a.socket, slot_count=4, slot_size=SIZE, wait_spin_us=5000) as p:
        done = []
        for i in range(3):
            with p.acquire(timeout=20) as loan:
                loan.write(pattern.payload(i, 100))
                loan.submit(frame_id=i)
            f = c.receive(timeout=20)
            assert f is not None
            with f:
                assert f.frame_id == i
        while len(done) < 3:
            got = p.wait_completions(timeout=20)
            assert got, "no completion within 20 s"
            done += got
        assert [(comp.frame_id, comp.delivered) for comp in done] == [(0, True), (1, True), (2, True)]
