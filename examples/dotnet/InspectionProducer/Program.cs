// An inspection processor: renders one frame per die image, tags it with frame id, wafer (its group id) and
// capture time, hands it to framelinkd and awaits its delivery to the remote consumer.
//
//   InspectionProducer --stream inspect [--socket PATH] [--count N | --seconds S] [--size 1M] [--slots 8]
//                      [--copy] [--json]
//
// Payloads follow FramePattern (the deterministic pattern of `framelink send`), so a receiver can
// check every byte. With --copy (implied by --seconds) every frame is a copy of one image rendered
// up front instead of being rendered in place (a benchmark of the client, not of the renderer).
using System.Diagnostics;
using FrameLink;
using FrameLink.Examples;

var opt = Options.Parse(args);
if (opt is null) return 2;

using var producer = new FrameLinkProducer(opt.Stream, new FrameLinkOptions
{
    SocketPath = opt.Socket, SlotCount = opt.Slots, SlotSize = opt.Size, ClientName = "inspection-producer",
});
using var stop = new CancellationTokenSource();
Console.CancelKeyPress += (_, e) => { e.Cancel = true; stop.Cancel(); };

long delivered = 0, failed = 0, bytes = 0, submitted = 0;
bool sending = true;
var clock = Stopwatch.StartNew();
var deadline = opt.Seconds > 0 ? TimeSpan.FromSeconds(opt.Seconds) : TimeSpan.MaxValue;
byte[]? rendered = null;
if (opt.Seconds > 0 || opt.Copy)
{
    rendered = new byte[opt.Size];
    FramePattern.Fill(0, rendered);
}

// Completions arrive on the doorbell while the loop below keeps producing.
var completions = Task.Run(async () =>
{
    await foreach (var c in producer.ReadCompletionsAsync(stop.Token))
    {
        if (c.Delivered) { delivered++; bytes += c.Length; }
        else { failed++; Console.Error.WriteLine($"frame {c.FrameId} failed: {c.Reason}"); }
        if (!Volatile.Read(ref sending) && delivered + failed == Interlocked.Read(ref submitted)) return;
    }
});

try
{
    for (ulong id = 0; !stop.IsCancellationRequested; id++)
    {
        if (opt.Seconds > 0 ? clock.Elapsed >= deadline : id >= (ulong)opt.Count) break;
        using var lease = await producer.AcquireAsync(stop.Token); // waits while every slot is in flight
        Span<byte> image = lease.Span[..opt.Size];
        if (rendered is null) FramePattern.Fill(id, image); // "render" the inspection image in place
        else rendered.CopyTo(image);
        lease.FrameId = id;
        lease.GroupId = FramePattern.WaferOf(id);
        lease.Timestamp = DateTimeOffset.UtcNow;
        lease.SetAttributes(FramePattern.Attributes(id));
        lease.Submit(opt.Size);
        Interlocked.Increment(ref submitted);
    }
}
catch (OperationCanceledException) { }
Volatile.Write(ref sending, false);
if (Interlocked.Read(ref submitted) == 0) stop.Cancel();
try
{
    using var patience = CancellationTokenSource.CreateLinkedTokenSource(stop.Token);
    patience.CancelAfter(TimeSpan.FromSeconds(60));
    await completions.WaitAsync(patience.Token);
}
catch (OperationCanceledException)
{
    Console.Error.WriteLine($"gave up waiting: {Interlocked.Read(ref submitted) - delivered - failed} frames without a completion");
}
double secs = clock.Elapsed.TotalSeconds;
if (opt.Json)
    Console.WriteLine($"{{\"submitted\":{submitted},\"delivered\":{delivered},\"failed\":{failed},\"bytes_delivered\":{bytes}," +
                      $"\"seconds\":{secs:F6},\"gb_per_s\":{bytes / secs / 1e9:F4},\"frames_per_s\":{delivered / secs:F1}}}");
else
    Console.WriteLine($"sent {submitted} inspection frames: {delivered} delivered, {failed} failed; " +
                      $"{bytes / secs / 1e9:F3} GB/s, {delivered / secs:F0} frames/s");
return failed == 0 && delivered == submitted ? 0 : 1;

sealed record Options(string Stream, string? Socket, int Count, double Seconds, int Size, int Slots, bool Copy, bool Json)
{
    public static Options? Parse(string[] args)
    {
        string? stream = null, socket = null;
        int count = 100, slots = 8, size = 1 << 20;
        double seconds = 0;
        bool json = false, copy = false;
        try
        {
            for (int i = 0; i < args.Length; i++)
            {
                string Next() => i + 1 < args.Length ? args[++i] : throw new ArgumentException($"{args[i]} needs a value");
                switch (args[i])
                {
                    case "--stream": stream = Next(); break;
                    case "--socket": socket = Next(); break;
                    case "--count": count = int.Parse(Next()); break;
                    case "--seconds": seconds = double.Parse(Next(), System.Globalization.CultureInfo.InvariantCulture); break;
                    case "--size": size = ParseSize(Next()); break;
                    case "--slots": slots = int.Parse(Next()); break;
                    case "--json": json = true; break;
                    case "--copy": copy = true; break;
                    default: throw new ArgumentException($"unknown option '{args[i]}'");
                }
            }
            if (stream is null) throw new ArgumentException("--stream NAME is required");
        }
        catch (Exception e) when (e is ArgumentException or FormatException or OverflowException)
        {
            Console.Error.WriteLine($"InspectionProducer: {e.Message}\nusage: InspectionProducer --stream NAME [--socket PATH] " +
                                    "[--count N | --seconds S] [--size 1M] [--slots 8] [--copy] [--json]");
            return null;
        }
        return new Options(stream, socket, count, seconds, size, slots, copy, json);
    }

    private static int ParseSize(string s)
    {
        long mult = 1;
        char last = char.ToUpperInvariant(s[^1]);
        if (last is 'K' or 'M' or 'G') { mult = last == 'K' ? 1 << 10 : last == 'M' ? 1 << 20 : 1 << 30; s = s[..^1]; }
        return checked((int)(long.Parse(s) * mult));
    }
}
