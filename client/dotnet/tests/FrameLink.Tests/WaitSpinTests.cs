using System.Runtime.CompilerServices;

namespace FrameLink.Tests;

/// <summary>The host's wait spin (the daemon's client_wait_spin_us) and the async calls that spin before they
/// await the doorbell. In the "daemons" collection so that no other test takes the CPU while one spins.</summary>
[Collection("daemons")]
public sealed class WaitSpinTests : IDisposable
{
    private const int Size = 4096;
    private const int Advised = 333;
    // Far longer than the 20 ms the frame takes to come, so that a slow machine still sees it within the spin.
    private const int LongSpin = 1_000_000;
    private static readonly TimeSpan Later = TimeSpan.FromMilliseconds(20);
    private readonly string dir = Directory.CreateTempSubdirectory("fl-cs-spin.").FullName;
    private readonly Daemon daemon;

    public WaitSpinTests() =>
        daemon = new Daemon(dir, "spin", ["--log-level", "warn", "--client-wait-spin-us", Advised.ToString()]);

    public void Dispose()
    {
        daemon.Dispose();
        Directory.Delete(dir, recursive: true);
    }

    private static string StreamName([CallerMemberName] string test = "") => "cs-" + test;
    private FrameLinkOptions Options(int spinUs = 0, int slots = 2) =>
        new() { SocketPath = daemon.Socket, SlotCount = slots, SlotSize = Size, WaitSpinMicroseconds = spinUs };

    private static void Send(FrameLinkProducer producer, ulong id)
    {
        using var lease = producer.Acquire(TimeSpan.FromSeconds(10));
        lease.FrameId = id;
        lease.Submit(64);
    }

    [Fact]
    public void WaitSpinMicrosecondsIsTheOptionElseTheDaemonsAdvice()
    {
        string stream = StreamName();
        using (var c = new FrameLinkConsumer(stream, Options()))
            Assert.Equal(Advised, c.WaitSpinMicroseconds);
        using (var c = new FrameLinkConsumer(stream, Options(spinUs: 5)))
            Assert.Equal(5, c.WaitSpinMicroseconds);
        using (var p = new FrameLinkProducer(stream, Options(spinUs: -1)))
            Assert.Equal(0, p.WaitSpinMicroseconds);
    }

    [Fact]
    public async Task ReceiveAsyncTakesAFrameWithinTheSpinWithoutTheDoorbell()
    {
        string stream = StreamName();
        using var consumer = new FrameLinkConsumer(stream, Options(LongSpin));
        using var producer = new FrameLinkProducer(stream, Options());
        Assert.False(consumer.TryReceive(out _));
        var sender = Task.Run(async () =>
        {
            await Task.Delay(Later);
            Send(producer, 7);
        });
        var pending = consumer.ReceiveAsync();
        // Completed before ReceiveAsync returned: the frame was taken by the spin, not after a doorbell.
        Assert.True(pending.IsCompletedSuccessfully);
        Assert.Equal(0L, consumer.DoorbellWaits);
        using (var frame = await pending)
            Assert.Equal(7ul, frame.FrameId);
        await sender.WaitAsync(TimeSpan.FromSeconds(10));
    }

    [Fact]
    public async Task WithoutASpinReceiveAsyncAwaitsTheDoorbell()
    {
        string stream = StreamName();
        using var consumer = new FrameLinkConsumer(stream, Options(spinUs: -1));
        using var producer = new FrameLinkProducer(stream, Options());
        var pending = consumer.ReceiveAsync();
        Assert.False(pending.IsCompleted);
        Assert.Equal(1L, consumer.DoorbellWaits);
        Send(producer, 8);
        using var cts = new CancellationTokenSource(TimeSpan.FromSeconds(10));
        using var frame = await pending.AsTask().WaitAsync(cts.Token);
        Assert.Equal(8ul, frame.FrameId);
    }

    [Fact]
    public async Task AcquireAsyncAndWaitCompletionsAsyncSpinToo()
    {
        string stream = StreamName();
        using var consumer = new FrameLinkConsumer(stream, Options());
        using var producer = new FrameLinkProducer(stream, Options(LongSpin, slots: 1));
        using (var lease = producer.Acquire(TimeSpan.FromSeconds(10)))
        {
            lease.FrameId = 9;
            lease.Submit(64);
        }
        // The one slot comes back once the consumer, 20 ms from now, releases the frame.
        var reader = Task.Run(async () =>
        {
            await Task.Delay(Later);
            using var f = consumer.Receive(TimeSpan.FromSeconds(10));
        });
        var done = new Completion[1];
        var completions = producer.WaitCompletionsAsync(done);
        Assert.True(completions.IsCompletedSuccessfully);
        Assert.Equal(1, await completions);
        Assert.True(done[0].Delivered, done[0].ToString());
        await reader.WaitAsync(TimeSpan.FromSeconds(10));

        using (var lease = producer.Acquire(TimeSpan.FromSeconds(10)))
        {
            lease.FrameId = 10;
            lease.Submit(64);
        }
        reader = Task.Run(async () =>
        {
            await Task.Delay(Later);
            using var f = consumer.Receive(TimeSpan.FromSeconds(10));
        });
        var acquired = producer.AcquireAsync();
        Assert.True(acquired.IsCompletedSuccessfully);
        (await acquired).Dispose();
        Assert.Equal(0L, producer.DoorbellWaits);
        await reader.WaitAsync(TimeSpan.FromSeconds(10));
    }
}
