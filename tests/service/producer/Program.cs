using FrameLink;
await using var producer = new FrameLinkProducer(args[0]);
int count = int.Parse(args[1]), done = 0, delivered = 0;
int pause = args.Length > 2 ? int.Parse(args[2]) : 0; // ms between frames
for (int id = 0; id < count; id++)
{
    if (pause > 0) await Task.Delay(pause);
    using var lease = await producer.AcquireAsync();
    lease.Span[..65536].Fill((byte)id);
    (lease.FrameId, lease.Crc32c) = ((ulong)id, true);
    lease.Submit(65536);
}
await foreach (var c in producer.ReadCompletionsAsync())
    if ((delivered += c.Delivered ? 1 : 0) >= 0 && ++done == count) break;
Console.WriteLine($"{count} frames sent, {delivered} delivered");
