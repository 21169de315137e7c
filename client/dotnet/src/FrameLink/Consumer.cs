using System.Buffers;
using System.Diagnostics.CodeAnalysis;
using System.Runtime.CompilerServices;
using System.Text;

namespace FrameLink;

/// <summary>
/// The consumer of one stream. Each <see cref="ReceivedFrame"/> is read-only shared memory, valid until
/// it is released (Dispose); releasing it is the acknowledgement the producer sees as delivered.
/// </summary>
public sealed class FrameLinkConsumer : FrameLinkClient
{
    public FrameLinkConsumer(string stream, FrameLinkOptions? options = null)
        : base(stream, options, Native.RoleConsumer, "consumer") { }

    internal SafeClientHandle NativeHandle => Handle;

    private unsafe int ReceiveCore(int timeoutMs, out ReceivedFrame? frame)
    {
        FlFrame f;
        int rc = Native.fl_receive(Handle, &f, timeoutMs); // with AutoReattach: Again/TimedOut while the daemon is away
        frame = rc == 0 ? new ReceivedFrame(this, f, Generation) : null;
        return rc;
    }

    private static bool Transient(int rc) => rc is (int)FrameLinkStatus.Again or (int)FrameLinkStatus.TimedOut or (int)FrameLinkStatus.Interrupted;

    public bool TryReceive([NotNullWhen(true)] out ReceivedFrame? frame)
    {
        int rc = ReceiveCore(0, out frame);
        if (rc == 0) return frame != null;
        if (Transient(rc)) return false;
        throw Native.Error(rc, "cannot receive a frame");
    }

    /// <summary>The next frame, or null when <paramref name="timeout"/> passes first.</summary>
    public ReceivedFrame? Receive(TimeSpan? timeout = null, CancellationToken cancellationToken = default)
    {
        ReceivedFrame? frame = null;
        WaitInSlices(ms =>
        {
            int rc = ReceiveCore(ms, out frame);
            if (rc == 0) return true;
            if (Transient(rc)) return false;
            throw Native.Error(rc, "cannot receive a frame");
        }, timeout, cancellationToken);
        return frame;
    }

    /// <summary>The next frame; completes synchronously when one is there or comes within
    /// <see cref="FrameLinkClient.WaitSpinMicroseconds"/>, else awaits the doorbell.</summary>
    public ValueTask<ReceivedFrame> ReceiveAsync(CancellationToken cancellationToken = default)
    {
        if (TryReceive(out var frame)) return new ValueTask<ReceivedFrame>(frame);
        ReceivedFrame? spun = null;
        if (SpinFor(() => TryReceive(out spun), cancellationToken)) return new ValueTask<ReceivedFrame>(spun!);
        return ReceiveSlowAsync(cancellationToken);
    }

    private async ValueTask<ReceivedFrame> ReceiveSlowAsync(CancellationToken ct)
    {
        while (true)
        {
            await WaitDoorbellAsync(ct).ConfigureAwait(false);
            if (TryReceive(out var frame)) return frame;
        }
    }

    /// <summary>Every frame as it arrives, until cancelled; dispose each one.</summary>
    public async IAsyncEnumerable<ReceivedFrame> ReadAllAsync([EnumeratorCancellation] CancellationToken cancellationToken = default)
    {
        while (true) yield return await ReceiveAsync(cancellationToken).ConfigureAwait(false);
    }
}

/// <summary>A delivered frame in read-only shared memory. Dispose (or Release) hands the slot back.</summary>
public sealed unsafe class ReceivedFrame : IDisposable
{
    private readonly FrameLinkConsumer consumer;
    private readonly byte* data;
    private readonly int length;
    private readonly uint slot;
    private readonly int generation;
    private readonly byte[] attributes;
    private FrameMemory? memory;
    private int released;

    internal ReceivedFrame(FrameLinkConsumer consumer, in FlFrame f, int generation)
    {
        this.consumer = consumer;
        this.generation = generation;
        data = f.Data;
        length = (int)f.Length;
        slot = f.Slot;
        Sequence = f.Sequence;
        FrameId = f.FrameId;
        GroupId = f.GroupId;
        TimestampNs = f.TimestampNs;
        HasCrc32c = (f.Flags & Native.SlotHasCrc32c) != 0;
        MaybeRedelivered = (f.Flags & Native.SlotMaybeRedelivered) != 0;
        GroupElsewhere = (f.Flags & Native.SlotGroupElsewhere) != 0;
        Gap = (f.Flags & Native.SlotGap) != 0 ? Native.fl_frame_gap(consumer.NativeHandle, f.Slot) : 0;
        Crc32c = f.Crc32c;
        attributes = new ReadOnlySpan<byte>(f.Attrs, (int)f.AttrLength).ToArray(); // <= 192 bytes of header
    }

    public ulong FrameId { get; }
    public ulong GroupId { get; }
    public ulong TimestampNs { get; }
    public DateTimeOffset Timestamp => DateTimeOffset.UnixEpoch.AddTicks((long)(TimestampNs / 100));
    public ulong Sequence { get; }
    public bool HasCrc32c { get; }
    /// <summary>Sent again after the receiving daemon restarted: the consumer before it may have seen this frame.</summary>
    public bool MaybeRedelivered { get; }
    /// <summary>A subscriber: a member of the stream's queue group on another host got this frame.</summary>
    public bool GroupElsewhere { get; }
    /// <summary>A subscriber of a drop stream: the frames it missed just before this one (it was too far behind).</summary>
    public uint Gap { get; }
    public uint Crc32c { get; }
    public int Length => length;
    public int SlotIndex => (int)slot;
    public ReadOnlySpan<byte> Attributes => attributes;
    public string AttributesText => Encoding.UTF8.GetString(attributes);
    public bool IsReleased => Volatile.Read(ref released) != 0;
    /// <summary>False once the consumer reattached to a restarted daemon: the frame's memory is gone.</summary>
    public bool IsValid => !IsReleased && generation == consumer.Generation;

    /// <summary>The payload, read-only, no copy.</summary>
    public ReadOnlySpan<byte> Span
    {
        get
        {
            ThrowIfReleased();
            return new ReadOnlySpan<byte>(data, length);
        }
    }

    /// <summary>The payload as ReadOnlyMemory; refuses to hand out the memory once the frame is released.</summary>
    public ReadOnlyMemory<byte> Memory
    {
        get
        {
            ThrowIfReleased();
            return (memory ??= new FrameMemory(this)).Memory;
        }
    }

    /// <summary>Hands the slot back: the producer sees the frame as delivered.</summary>
    public void Release()
    {
        if (Interlocked.Exchange(ref released, 1) != 0)
            throw new ObjectDisposedException(nameof(ReceivedFrame), $"frame {FrameId} was already released");
        if (generation != consumer.Generation) return; // its attachment, and the slot, are gone
        Native.Check(Native.fl_release(consumer.NativeHandle, slot), $"cannot release frame {FrameId}");
    }

    public void Dispose()
    {
        if (IsReleased) return;
        try
        {
            Release();
        }
        catch (ObjectDisposedException)
        {
            // The consumer is gone; nothing left to give the slot back to.
        }
    }

    internal void ThrowIfReleased()
    {
        if (generation != consumer.Generation && !IsReleased)
            throw new ObjectDisposedException(nameof(ReceivedFrame),
                $"frame {FrameId} belonged to the attachment before the consumer reattached to a restarted daemon; its memory is gone");
        if (IsReleased)
            throw new ObjectDisposedException(nameof(ReceivedFrame),
                $"frame {FrameId} was released; its slot may hold another frame now. Copy what you need before releasing.");
    }

    // Memory<byte> over read-only shared memory: ReadOnlyMemory only, so nobody gets a writable Span of it.
    private sealed class FrameMemory : MemoryManager<byte>
    {
        private readonly ReceivedFrame frame;
        public FrameMemory(ReceivedFrame frame) => this.frame = frame;
        public override Span<byte> GetSpan()
        {
            frame.ThrowIfReleased();
            return new Span<byte>(frame.data, frame.length);
        }
        public override MemoryHandle Pin(int elementIndex = 0)
        {
            frame.ThrowIfReleased();
            return new MemoryHandle(frame.data + elementIndex);
        }
        public override void Unpin() { }
        protected override void Dispose(bool disposing) { }
    }
}
