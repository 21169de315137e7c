using System.Runtime.CompilerServices;
using FrameLink.Examples;

namespace FrameLink.Tests;

[Collection("daemons")]
public sealed class ClientTests
{
    private const int Size = 64 * 1024;
    private readonly DaemonPair pair;

    public ClientTests(DaemonPair pair) => this.pair = pair;

    private static string StreamName([CallerMemberName] string test = "") => "cs-" + test;
    private FrameLinkOptions A(int slots = 4) => new() { SocketPath = pair.SocketA, SlotCount = slots, SlotSize = Size };
    private FrameLinkOptions B(int slots = 4) => new() { SocketPath = pair.SocketB, SlotCount = slots, SlotSize = Size };

    [Fact]
    public async Task RoundTripThroughTwoDaemonsKeepsEveryByteAndField()
    {
        const int n = 16;
        string stream = StreamName();
        using var consumer = new FrameLinkConsumer(stream, B());
        using var producer = new FrameLinkProducer(stream, A());
        Assert.Equal(4, producer.SlotCount);
        Assert.True(producer.SlotSize >= Size);
        using var cts = new CancellationTokenSource(TimeSpan.FromSeconds(30));

        var received = Task.Run(async () =>
        {
            var seen = new List<(ulong Id, ulong Wafer, ulong Ts, string Attrs, int Length, int Bad, bool Crc)>();
            await foreach (var f in consumer.ReadAllAsync(cts.Token))
            {
                using (f)
                    seen.Add((f.FrameId, f.GroupId, f.TimestampNs, f.AttributesText, f.Length, FramePattern.Mismatch(f.FrameId, f.Span), f.HasCrc32c));
                if (seen.Count == n) return seen;
            }
            return seen;
        });

        var sent = new Dictionary<ulong, (int Length, ulong Ts)>();
        var completions = new List<Completion>();
        var reading = Task.Run(async () =>
        {
            await foreach (var c in producer.ReadCompletionsAsync(cts.Token))
            {
                completions.Add(c);
                if (completions.Count == n) return;
            }
        });
        for (ulong id = 0; id < n; id++)
        {
            using var lease = await producer.AcquireAsync(cts.Token); // 4 slots: backpressure after 4
            int length = Size - 8 * (int)id - (int)(id % 3);
            FramePattern.Fill(id, lease.Span[..length]);
            lease.FrameId = id;
            lease.GroupId = FramePattern.WaferOf(id);
            lease.TimestampNs = 1_700_000_000_000_000_000UL + id;
            lease.SetAttributes(FramePattern.Attributes(id));
            lease.Crc32c = id == 3;
            lease.Submit(length);
            sent[id] = (length, lease.TimestampNs);
        }
        await reading.WaitAsync(cts.Token);
        var frames = await received.WaitAsync(cts.Token);

        Assert.Equal(Enumerable.Range(0, n).Select(i => (ulong)i), completions.Select(c => c.FrameId).Order());
        Assert.All(completions, c => Assert.True(c.Delivered, c.ToString()));
        Assert.All(completions, c => Assert.Equal(sent[c.FrameId].Length, c.Length));
        Assert.Equal(0, producer.InFlight);
        Assert.Equal(Enumerable.Range(0, n).Select(i => (ulong)i), frames.Select(f => f.Id));
        foreach (var f in frames)
        {
            Assert.Equal(FramePattern.WaferOf(f.Id), f.Wafer);
            Assert.Equal(sent[f.Id].Ts, f.Ts);
            Assert.Equal(FramePattern.Attributes(f.Id), f.Attrs);
            Assert.Equal(sent[f.Id].Length, f.Length);
            Assert.Equal(-1, f.Bad);
            Assert.Equal(f.Id == 3, f.Crc);
        }
    }

    [Fact]
    public void LeaseMisuseThrows()
    {
        string stream = StreamName();
        using var consumer = new FrameLinkConsumer(stream, B());
        using var producer = new FrameLinkProducer(stream, A(slots: 1));
        var lease = producer.Acquire(TimeSpan.FromSeconds(10));
        Memory<byte> memory = lease.Memory;
        memory.Span[0] = 42;
        Assert.Throws<ArgumentOutOfRangeException>(() => lease.Submit(lease.Capacity + 1));
        Assert.Throws<ArgumentException>(() => lease.SetAttributes(new byte[193]));
        // The only slot is held: a second acquire times out with a message that says why.
        var timeout = Assert.Throws<TimeoutException>(() => producer.Acquire(TimeSpan.FromMilliseconds(50)));
        Assert.Contains("held or in flight", timeout.Message);
        lease.FrameId = 7;
        lease.Submit(1);
        Assert.Throws<ObjectDisposedException>(() => lease.Span.Length);
        Assert.Throws<ObjectDisposedException>(() => memory.Span.Length); // Memory taken before Submit
        Assert.Throws<ObjectDisposedException>(() => { using var pin = memory.Pin(); });
        Assert.Throws<ObjectDisposedException>(() => lease.Submit(1));
        lease.Dispose(); // after Submit: nothing to give back, no exception

        using var frame = consumer.Receive(TimeSpan.FromSeconds(20));
        Assert.NotNull(frame);
        Assert.Equal(42, frame.Span[0]);
        ReadOnlyMemory<byte> payload = frame.Memory;
        frame.Release();
        Assert.Throws<ObjectDisposedException>(() => frame.Span.Length);
        Assert.Throws<ObjectDisposedException>(() => payload.Span.Length);
        Assert.Throws<ObjectDisposedException>(() => frame.Release());

        var done = new Completion[1];
        Assert.Equal(1, producer.WaitCompletions(done, TimeSpan.FromSeconds(20)));
        Assert.True(done[0].Delivered, done[0].ToString());
        Assert.Equal(7UL, done[0].FrameId);

        // Dispose without Submit gives the slot back: it can be acquired again at once.
        using (producer.Acquire(TimeSpan.FromSeconds(5))) { }
        Assert.True(producer.TryAcquire(out var again));
        again.Dispose();
    }

    [Fact]
    public async Task CancellationEndsAsyncWaitsPromptly()
    {
        string stream = StreamName();
        using var consumer = new FrameLinkConsumer(stream, B());
        using var producer = new FrameLinkProducer(stream, A(slots: 1));
        using var cts = new CancellationTokenSource(TimeSpan.FromMilliseconds(300));
        var t0 = DateTime.UtcNow;
        await Assert.ThrowsAnyAsync<OperationCanceledException>(async () => await consumer.ReceiveAsync(cts.Token));
        Assert.True(DateTime.UtcNow - t0 < TimeSpan.FromSeconds(2));

        using var cts2 = new CancellationTokenSource(TimeSpan.FromMilliseconds(300));
        await Assert.ThrowsAnyAsync<OperationCanceledException>(async () =>
        {
            await foreach (var _ in producer.ReadCompletionsAsync(cts2.Token)) { }
        });

        using var held = producer.Acquire(TimeSpan.FromSeconds(5));
        using var cts3 = new CancellationTokenSource(TimeSpan.FromMilliseconds(300));
        await Assert.ThrowsAnyAsync<OperationCanceledException>(async () => await producer.AcquireAsync(cts3.Token));
        Assert.Throws<OperationCanceledException>(() => producer.Acquire(null, new CancellationToken(true)));
    }

    [Fact]
    public void AttachFailuresSayWhatWasWrong()
    {
        var bad = new FrameLinkOptions { SocketPath = "/nonexistent/framelink.sock" };
        var e = Assert.Throws<FrameLinkException>(() => new FrameLinkProducer(StreamName(), bad));
        Assert.Equal(FrameLinkStatus.DaemonUnreachable, e.Status);
        Assert.Contains("/nonexistent/framelink.sock", e.Message);
        var e2 = Assert.Throws<FrameLinkException>(() => new FrameLinkConsumer("bad name!", B()));
        Assert.Contains(e2.Status, new[] { FrameLinkStatus.BadRequest, FrameLinkStatus.InvalidArgument });
        Assert.Throws<ArgumentException>(() => new FrameLinkProducer("", A()));
    }

    [Fact]
    public void UseAfterDisposeThrows()
    {
        var producer = new FrameLinkProducer(StreamName(), A());
        producer.Dispose();
        Assert.Throws<ObjectDisposedException>(() => producer.TryAcquire(out _));
        Assert.Throws<ObjectDisposedException>(() => producer.InFlight);
    }

    [Fact]
    public void AStalledSubscriberOfADropStreamIsSkippedAndToldTheGap()
    {
        const string stream = DaemonPair.DropStream;
        using var slow = new FrameLinkConsumer(stream, A(1) with { Subscribe = true });
        // A slot for every frame: a release the daemon has not taken yet never leaves it full (and
        // so skipped too) while the frames below wait.
        using var fast = new FrameLinkConsumer(stream, A(8) with { Subscribe = true });
        using var producer = new FrameLinkProducer(stream, A(8));
        void Send(ulong id)
        {
            using var lease = producer.Acquire(TimeSpan.FromSeconds(10));
            FramePattern.Fill(id, lease.Span[..100]);
            lease.FrameId = id;
            lease.Submit(100);
        }
        Send(0);
        var held = slow.Receive(TimeSpan.FromSeconds(10)); // its only slot, kept
        Assert.NotNull(held);
        Assert.Equal(0u, held!.Gap);
        fast.Receive(TimeSpan.FromSeconds(10))!.Dispose();
        for (ulong id = 1; id <= 5; id++) Send(id);
        // More than one frame waiting for it: it is skipped for frames 1 .. 4, frame 5 waits.
        for (ulong id = 1; id <= 4; id++)
        {
            var f = fast.Receive(TimeSpan.FromSeconds(10));
            Assert.NotNull(f);
            Assert.Equal(id, f!.FrameId);
            Assert.Equal(0u, f.Gap);
            f.Dispose();
        }
        held.Dispose();
        var next = slow.Receive(TimeSpan.FromSeconds(10));
        Assert.NotNull(next);
        Assert.Equal(5ul, next!.FrameId);
        Assert.Equal(4u, next.Gap);
        next.Dispose();
        var last = fast.Receive(TimeSpan.FromSeconds(10));
        Assert.NotNull(last);
        Assert.Equal(5ul, last!.FrameId);
        last.Dispose();
        // Each meant for both; the completion names the subscriber skipped for frames 1 .. 4.
        var skipped = new Dictionary<ulong, int>();
        var done = new Completion[8];
        while (skipped.Count < 6)
        {
            int n = producer.WaitCompletions(done, TimeSpan.FromSeconds(10));
            Assert.True(n > 0, $"completions of frames 0 .. 5, got {skipped.Count}");
            foreach (var c in done.AsSpan(0, n))
            {
                Assert.True(c.Delivered, c.ToString());
                Assert.Equal(2, c.Readers);
                skipped[c.FrameId] = c.Skipped;
            }
        }
        for (ulong id = 0; id <= 5; id++) Assert.Equal(id is >= 1 and <= 4 ? 1 : 0, skipped[id]);
    }

    [Fact]
    public void LocalSubscriberGetsEveryFrameAndTheQueueGroupSharesThem()
    {
        string stream = StreamName();
        using var subscriber = new FrameLinkConsumer(stream, A() with { Subscribe = true });
        using var member1 = new FrameLinkConsumer(stream, A());
        using var member2 = new FrameLinkConsumer(stream, A());
        using var producer = new FrameLinkProducer(stream, A());
        var shares = new int[2];
        var done = new Completion[4];
        for (ulong id = 0; id < 8; id++)
        {
            using (var lease = producer.Acquire(TimeSpan.FromSeconds(10)))
            {
                FramePattern.Fill(id, lease.Span[..(1000 + (int)id)]);
                lease.FrameId = id;
                lease.Crc32c = true;
                lease.Submit(1000 + (int)id);
            }
            var f = subscriber.Receive(TimeSpan.FromSeconds(10));
            Assert.NotNull(f);
            Assert.Equal(id, f!.FrameId);
            Assert.True(f.HasCrc32c);
            Assert.Equal(-1, FramePattern.Mismatch(id, f.Span));
            ReceivedFrame? m = null;
            for (int i = 0; i < 2; i++)
            {
                var g = (i == 0 ? member1 : member2).Receive(TimeSpan.FromMilliseconds(m is null ? 1000 : 0));
                if (g is null) continue;
                Assert.Null(m); // one member, not two
                m = g;
                shares[i]++;
            }
            Assert.NotNull(m);
            Assert.Equal(-1, FramePattern.Mismatch(id, m!.Span));
            f.Dispose();
            Assert.Equal(0, producer.WaitCompletions(done, TimeSpan.FromMilliseconds(200))); // m still holds it
            m.Dispose();
            Assert.Equal(1, producer.WaitCompletions(done, TimeSpan.FromSeconds(10)));
            Assert.True(done[0].Delivered, done[0].ToString());
            Assert.Equal(id, done[0].FrameId);
            Assert.Equal(2, done[0].Readers); // the subscriber and one member
            Assert.Equal(2, done[0].Released);
        }
        Assert.Equal(new[] { 4, 4 }, shares);
    }

    [Fact]
    public void RemoteSubscribersEachGetEveryFrameThatCrossedTheLinkOnce()
    {
        string stream = StreamName();
        using var first = new FrameLinkConsumer(stream, B() with { Subscribe = true });
        using var second = new FrameLinkConsumer(stream, B() with { Subscribe = true });
        using var producer = new FrameLinkProducer(stream, A());
        var done = new Completion[4];
        for (ulong id = 0; id < 6; id++)
        {
            using (var lease = producer.Acquire(TimeSpan.FromSeconds(10)))
            {
                FramePattern.Fill(id, lease.Span[..(2000 + (int)id)]);
                lease.FrameId = id;
                lease.Crc32c = true;
                lease.Submit(2000 + (int)id);
            }
            foreach (var reader in new[] { first, second })
            {
                using var f = reader.Receive(TimeSpan.FromSeconds(10));
                Assert.NotNull(f);
                Assert.Equal(id, f!.FrameId);
                Assert.Equal(-1, FramePattern.Mismatch(id, f.Span));
            }
            Assert.Equal(1, producer.WaitCompletions(done, TimeSpan.FromSeconds(10)));
            Assert.True(done[0].Delivered, done[0].ToString());
            Assert.Equal(2, done[0].Readers);
            Assert.Equal(2, done[0].Released);
        }
    }

    [Fact]
    public void AConsumerAskingForPullHasItsFramesReadByItsDaemon()
    {
        string stream = StreamName();
        long before = FramesPulled(pair.SocketB);
        using var consumer = new FrameLinkConsumer(stream, B() with { Pull = true });
        using var producer = new FrameLinkProducer(stream, A());
        var done = new Completion[4];
        for (ulong id = 0; id < 6; id++)
        {
            using (var lease = producer.Acquire(TimeSpan.FromSeconds(10)))
            {
                FramePattern.Fill(id, lease.Span[..(5000 + (int)id)]);
                lease.FrameId = id;
                lease.Submit(5000 + (int)id);
            }
            using (var f = consumer.Receive(TimeSpan.FromSeconds(10)))
            {
                Assert.NotNull(f);
                Assert.Equal(id, f!.FrameId);
                Assert.Equal(-1, FramePattern.Mismatch(id, f.Span));
            }
            Assert.Equal(1, producer.WaitCompletions(done, TimeSpan.FromSeconds(10)));
            Assert.True(done[0].Delivered, done[0].ToString());
        }
        // B read each frame A offered: nothing was written into the consumer's slots.
        Assert.Equal(before + 6, FramesPulled(pair.SocketB));
    }

    [Fact]
    public void AProducerCannotAskForPull()
    {
        var e = Assert.Throws<FrameLinkException>(() => new FrameLinkProducer(StreamName(), A() with { Pull = true }));
        Assert.Contains("pull is for consumers", e.Message);
    }

    // The daemon's frames_pulled counter, from `framelink stats --json --once`.
    private static long FramesPulled(string socket)
    {
        var cli = new System.Diagnostics.ProcessStartInfo(Path.Combine(Repo.BuildDir, "client", "cli", "framelink"))
        {
            RedirectStandardOutput = true,
            RedirectStandardError = true,
        };
        foreach (var arg in new[] { "stats", "--json", "--once", "--socket", socket }) cli.ArgumentList.Add(arg);
        using var p = System.Diagnostics.Process.Start(cli)!;
        string json = p.StandardOutput.ReadToEnd();
        string err = p.StandardError.ReadToEnd();
        p.WaitForExit();
        Assert.True(p.ExitCode == 0, $"framelink stats: {err}");
        using var doc = System.Text.Json.JsonDocument.Parse(json);
        return doc.RootElement.GetProperty("counters").TryGetProperty("frames_pulled", out var v) ? v.GetInt64() : 0;
    }

    [Fact]
    public void WaitSpinMicrosecondsIsPassedThroughAndChecked()
    {
        string stream = StreamName();
        Assert.Throws<ArgumentOutOfRangeException>(() => new FrameLinkConsumer(stream, B() with { WaitSpinMicroseconds = -2 }));
        var e = Assert.Throws<FrameLinkException>(() => new FrameLinkConsumer(stream, B() with { WaitSpinMicroseconds = 1_000_001 }));
        Assert.Contains("wait_spin_us is 1000001", e.Message);
        // No spin on one side, a long one on the other: frames move either way.
        using var consumer = new FrameLinkConsumer(stream, B() with { WaitSpinMicroseconds = -1 });
        using var producer = new FrameLinkProducer(stream, A() with { WaitSpinMicroseconds = 5000 });
        var done = new Completion[4];
        for (ulong id = 0; id < 3; id++)
        {
            using (var lease = producer.Acquire(TimeSpan.FromSeconds(10)))
            {
                FramePattern.Fill(id, lease.Span[..1000]);
                lease.FrameId = id;
                lease.Submit(1000);
            }
            using (var f = consumer.Receive(TimeSpan.FromSeconds(10)))
            {
                Assert.NotNull(f);
                Assert.Equal(id, f!.FrameId);
            }
            Assert.Equal(1, producer.WaitCompletions(done, TimeSpan.FromSeconds(10)));
            Assert.True(done[0].Delivered, done[0].ToString());
        }
    }

    [Fact]
    public void AProducerCannotSubscribe()
    {
        var e = Assert.Throws<FrameLinkException>(() => new FrameLinkProducer(StreamName(), A() with { Subscribe = true }));
        Assert.Contains("subscribe is for consumers", e.Message);
    }
}
