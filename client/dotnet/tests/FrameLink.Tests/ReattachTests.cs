using FrameLink.Examples;

namespace FrameLink.Tests;

/// <summary>A daemon killed and started again: Reattach and AutoReattach keep the same client objects working.</summary>
public sealed class ReattachTests
{
    private const int Size = 64 * 1024;

    private static void Send(FrameLinkProducer producer, ulong id, int length)
    {
        using var lease = producer.Acquire(TimeSpan.FromSeconds(10));
        FramePattern.Fill(id, lease.Span[..length]);
        lease.FrameId = id;
        lease.Submit(length);
    }

    private static void KillA(DaemonPair pair, FrameLinkClient client)
    {
        pair.A.Kill();
        var deadline = DateTime.UtcNow.AddSeconds(5);
        while (true)
        {
            var e = Record.Exception(client.CheckDaemon);
            if (e is FrameLinkException { Status: FrameLinkStatus.DaemonGone }) return;
            Assert.True(DateTime.UtcNow < deadline, "the client did not notice that its daemon was killed");
            Thread.Sleep(10);
        }
    }

    [Fact]
    public async Task AutoReattachCarriesOnAfterTheDaemonRestarts()
    {
        using var pair = new DaemonPair();
        using var cts = new CancellationTokenSource(TimeSpan.FromSeconds(60));
        using var consumer = new FrameLinkConsumer("cs-auto", new() { SocketPath = pair.SocketB, SlotCount = 4, SlotSize = Size });
        using var producer = new FrameLinkProducer("cs-auto",
            new() { SocketPath = pair.SocketA, SlotCount = 4, SlotSize = Size }); // AutoReattach is on by default
        ulong pidBefore = producer.Info.DaemonPid;

        Send(producer, 1, 1000);                                   // in flight: the consumer holds it
        var held = consumer.Receive(TimeSpan.FromSeconds(10), cts.Token);
        Assert.NotNull(held);
        var lease = producer.Acquire(TimeSpan.FromSeconds(5));     // held by the application

        KillA(pair, producer);
        // While no daemon is there: no slot, no exception; frame 1, in flight, ends as unknown.
        Assert.False(producer.TryAcquire(out _));
        var buf = new Completion[8];
        int n = producer.PollCompletions(buf);
        Assert.Equal(1, n);
        Assert.Equal(1UL, buf[0].FrameId);
        Assert.Equal(FrameLinkStatus.DaemonGone, buf[0].Status);
        Assert.Equal(0, producer.Generation);

        var acquiring = producer.AcquireAsync(cts.Token).AsTask();
        pair.RestartA();
        using (var fresh = await acquiring.WaitAsync(cts.Token))
        {
            Assert.Equal(1, producer.Generation);
            Assert.NotEqual(pidBefore, producer.Info.DaemonPid);
            Assert.True(fresh.IsActive);
        }
        // The lease of the old attachment is void; disposing it is harmless.
        Assert.False(lease.IsActive);
        Assert.Throws<ObjectDisposedException>(() => lease.Span.Length);
        lease.Dispose();

        // Exactly one completion for frame 1: nothing more after the reattach.
        Assert.Equal(0, producer.PollCompletions(buf));

        held!.Dispose();
        // New frames flow through the restarted daemon.
        Send(producer, 2, 2000);
        using (var f = consumer.Receive(TimeSpan.FromSeconds(20), cts.Token))
        {
            Assert.NotNull(f);
            Assert.Equal(2UL, f!.FrameId);
            Assert.Equal(-1, FramePattern.Mismatch(2, f.Span));
        }
        n = producer.WaitCompletions(buf, TimeSpan.FromSeconds(20), cts.Token);
        Assert.Equal(1, n);
        Assert.True(buf[0].Delivered, buf[0].ToString());
        Assert.Equal(2UL, buf[0].FrameId);
    }

    [Fact]
    public void WithoutAutoReattachTheCallerReattachesWithOneCall()
    {
        using var pair = new DaemonPair();
        using var consumer = new FrameLinkConsumer("cs-manual", new() { SocketPath = pair.SocketA, SlotCount = 2, SlotSize = Size, AutoReattach = false });
        consumer.Reattach(); // still served: nothing changes
        Assert.Equal(0, consumer.Generation);
        KillA(pair, consumer);
        var gone = Assert.Throws<FrameLinkException>(() => consumer.TryReceive(out _));
        Assert.Equal(FrameLinkStatus.DaemonGone, gone.Status);
        var down = Assert.Throws<FrameLinkException>(consumer.Reattach); // nobody listening yet
        Assert.Equal(FrameLinkStatus.DaemonUnreachable, down.Status);
        pair.RestartA();
        consumer.Reattach();
        Assert.Equal(1, consumer.Generation);
        consumer.CheckDaemon();
        Assert.False(consumer.TryReceive(out _));
    }

    [Fact]
    public void ADaemonBackRefusingForGoodEndsAutoReattach()
    {
        using var pair = new DaemonPair();
        using var producer = new FrameLinkProducer("cs-shrunk",
            new() { SocketPath = pair.SocketA, SlotCount = 2, SlotSize = Size, ReattachIntervalMs = 20 });
        KillA(pair, producer);
        pair.RestartA("--max-slot-size", "4096"); // smaller than the slots this producer asks for

        // The call that meets the refusal throws it once, with the daemon's reason...
        var first = Assert.Throws<FrameLinkException>(() => producer.Acquire(TimeSpan.FromSeconds(20)));
        Assert.Equal(FrameLinkStatus.Limit, first.Status);
        Assert.Contains("max_slot_size", first.Message);
        // ...and later calls say the daemon dropped it for good, at once.
        var started = DateTime.UtcNow;
        var later = Assert.Throws<FrameLinkException>(() => producer.Acquire(TimeSpan.FromSeconds(5)));
        Assert.Equal(FrameLinkStatus.DaemonGone, later.Status);
        Assert.Contains("FL_ERR_LIMIT", later.Message);
        Assert.True(DateTime.UtcNow - started < TimeSpan.FromSeconds(4));
    }
}
