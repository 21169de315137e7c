namespace FrameLink.Tests;

/// <summary>Async waits of many clients: one doorbell thread for the process, every waiter woken.</summary>
[Collection("daemons")]
public sealed class DoorbellTests
{
    private readonly DaemonPair pair;

    public DoorbellTests(DaemonPair pair) => this.pair = pair;

    /// <summary>Threads of this process named framelink-doorbell (comm keeps 15 characters).</summary>
    private static int DoorbellThreads() => Directory.GetDirectories("/proc/self/task")
        .Count(t => File.Exists(Path.Combine(t, "comm")) && File.ReadAllText(Path.Combine(t, "comm")).Trim() == "framelink-doorb");

    [Fact]
    public async Task EightAwaitingSubscribersShareOneThreadAndEachGetsTheFrame()
    {
        const string stream = "cs-doorbell-shared";
        var options = new FrameLinkOptions { SocketPath = pair.SocketA, SlotCount = 2, SlotSize = 4096, Subscribe = true };
        var subscribers = Enumerable.Range(0, 8).Select(_ => new FrameLinkConsumer(stream, options)).ToList();
        try
        {
            using var cts = new CancellationTokenSource(TimeSpan.FromSeconds(30));
            var waits = subscribers.Select(s => s.ReceiveAsync(cts.Token).AsTask()).ToList();
            await Task.Delay(200);
            Assert.All(waits, w => Assert.False(w.IsCompleted)); // all of them waiting on their doorbells
            Assert.Equal(1, DoorbellThreads());

            await using (var producer = new FrameLinkProducer(stream, options with { Subscribe = false }))
            {
                using (var lease = await producer.AcquireAsync(cts.Token))
                {
                    "ring"u8.CopyTo(lease.Span);
                    lease.FrameId = 7;
                    lease.Submit(4);
                }
                foreach (var frame in await Task.WhenAll(waits))
                {
                    using (frame)
                    {
                        Assert.Equal(7ul, frame.FrameId);
                        Assert.Equal("ring"u8.ToArray(), frame.Span.ToArray());
                    }
                }
                var done = new Completion[1];
                Assert.Equal(1, producer.WaitCompletions(done, TimeSpan.FromSeconds(10)));
                Assert.True(done[0].Delivered, done[0].ToString());
                Assert.Equal(8, done[0].Readers);
            }
            Assert.Equal(1, DoorbellThreads());
        }
        finally
        {
            foreach (var s in subscribers) await s.DisposeAsync();
        }
    }

    [Fact]
    public async Task DisposingAClientFailsItsWaitAndLeavesTheOthersWaiting()
    {
        const string stream = "cs-doorbell-dispose";
        var options = new FrameLinkOptions { SocketPath = pair.SocketA, SlotCount = 2, SlotSize = 4096, Subscribe = true };
        await using var kept = new FrameLinkConsumer(stream, options);
        var gone = new FrameLinkConsumer(stream, options);
        using var cts = new CancellationTokenSource(TimeSpan.FromSeconds(30));
        var keptWait = kept.ReceiveAsync(cts.Token).AsTask();
        var goneWait = gone.ReceiveAsync(cts.Token).AsTask();
        await Task.Delay(100);
        await gone.DisposeAsync();
        await Assert.ThrowsAsync<ObjectDisposedException>(() => goneWait);
        await Task.Delay(100);
        Assert.False(keptWait.IsCompleted);
        cts.Cancel();
        await Assert.ThrowsAnyAsync<OperationCanceledException>(() => keptWait);
    }
}
