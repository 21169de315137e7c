using System.Buffers;
using System.Diagnostics.CodeAnalysis;
using System.Runtime.CompilerServices;
using System.Text;

namespace FrameLink;

/// <summary>
/// The producer of one stream. Acquire a slot as a <see cref="ProducerLease"/>, write the frame into
/// its <see cref="ProducerLease.Span"/>, set the metadata, <see cref="ProducerLease.Submit"/>; every
/// submitted frame later yields exactly one <see cref="Completion"/>.
/// </summary>
public sealed class FrameLinkProducer : FrameLinkClient
{
    public FrameLinkProducer(string stream, FrameLinkOptions? options = null)
        : base(stream, options, Native.RoleProducer, "producer") { }

    internal SafeClientHandle NativeHandle => Handle;

    private unsafe int TryAcquireCore(int timeoutMs, out ProducerLease? lease)
    {
        FlSlot slot;
        int rc = Native.fl_acquire(Handle, timeoutMs, &slot); // with AutoReattach: Again/TimedOut while the daemon is away
        lease = rc == 0 ? new ProducerLease(this, slot, Generation) : null;
        return rc;
    }

    private static bool Transient(int rc) => rc is (int)FrameLinkStatus.Again or (int)FrameLinkStatus.TimedOut or (int)FrameLinkStatus.Interrupted;

    /// <summary>A free slot now, or false when every slot is held or in flight.</summary>
    public bool TryAcquire([NotNullWhen(true)] out ProducerLease? lease)
    {
        int rc = TryAcquireCore(0, out lease);
        if (rc == 0) return lease != null;
        if (Transient(rc)) return false;
        throw Native.Error(rc, "cannot acquire a slot");
    }

    /// <summary>Waits for a free slot (backpressure). TimeoutException after <paramref name="timeout"/>.</summary>
    public ProducerLease Acquire(TimeSpan? timeout = null, CancellationToken cancellationToken = default)
    {
        ProducerLease? lease = null;
        bool ok = WaitInSlices(ms =>
        {
            int rc = TryAcquireCore(ms, out lease);
            if (rc == 0) return true;
            if (Transient(rc)) return false;
            throw Native.Error(rc, "cannot acquire a slot");
        }, timeout, cancellationToken);
        if (!ok)
            throw new TimeoutException($"no free slot within {timeout}: every slot is held or in flight; " +
                                       "read completions, or submit or dispose the leases you hold");
        return lease!;
    }

    /// <summary>A free slot; completes synchronously when one is free or frees within
    /// <see cref="FrameLinkClient.WaitSpinMicroseconds"/>, else awaits the doorbell.</summary>
    public ValueTask<ProducerLease> AcquireAsync(CancellationToken cancellationToken = default)
    {
        if (TryAcquire(out var lease)) return new ValueTask<ProducerLease>(lease);
        ProducerLease? spun = null;
        if (SpinFor(() => TryAcquire(out spun), cancellationToken)) return new ValueTask<ProducerLease>(spun!);
        return AcquireSlowAsync(cancellationToken);
    }

    private async ValueTask<ProducerLease> AcquireSlowAsync(CancellationToken ct)
    {
        while (true)
        {
            await WaitDoorbellAsync(ct).ConfigureAwait(false);
            if (TryAcquire(out var lease)) return lease;
        }
    }

    /// <summary>Completions available now, into <paramref name="into"/>; returns how many (possibly 0).</summary>
    public unsafe int PollCompletions(Span<Completion> into)
    {
        if (into.IsEmpty) return 0;
        nuint n = 0;
        int rc;
        fixed (Completion* p = into)
        {
            rc = Native.fl_poll_completions(Handle, p, (nuint)into.Length, &n);
        }
        if (rc == 0) return (int)n;
        if (Transient(rc)) return 0;
        throw Native.Error(rc, "cannot read completions");
    }

    public unsafe bool TryPollCompletion(out Completion completion)
    {
        Completion c = default;
        int n = PollCompletions(new Span<Completion>(&c, 1));
        completion = c;
        return n == 1;
    }

    /// <summary>Waits for at least one completion; returns how many were written into <paramref name="into"/>.
    /// Completes synchronously when one is there or comes within
    /// <see cref="FrameLinkClient.WaitSpinMicroseconds"/>, else awaits the doorbell.</summary>
    public async ValueTask<int> WaitCompletionsAsync(Memory<Completion> into, CancellationToken cancellationToken = default)
    {
        if (into.IsEmpty) throw new ArgumentException("needs room for at least one completion", nameof(into));
        int n = PollCompletions(into.Span);
        if (n > 0) return n;
        if (SpinFor(() => (n = PollCompletions(into.Span)) > 0, cancellationToken)) return n;
        while (true)
        {
            await WaitDoorbellAsync(cancellationToken).ConfigureAwait(false);
            n = PollCompletions(into.Span);
            if (n > 0) return n;
        }
    }

    /// <summary>Blocking: at least one completion, or 0 when the timeout passes.</summary>
    public unsafe int WaitCompletions(Span<Completion> into, TimeSpan? timeout = null, CancellationToken cancellationToken = default)
    {
        if (into.IsEmpty) throw new ArgumentException("needs room for at least one completion", nameof(into));
        int got = 0;
        fixed (Completion* p = into)
        {
            var ptr = (IntPtr)p;
            int len = into.Length;
            WaitInSlices(ms =>
            {
                nuint n = 0;
                int rc = Native.fl_wait_completions(Handle, (Completion*)ptr, (nuint)len, &n, ms);
                if (rc == 0 && n > 0) { got = (int)n; return true; }
                if (rc == 0 || Transient(rc)) return false;
                throw Native.Error(rc, "cannot read completions");
            }, timeout, cancellationToken);
        }
        return got;
    }

    /// <summary>Every completion as it arrives, until cancelled.</summary>
    public async IAsyncEnumerable<Completion> ReadCompletionsAsync([EnumeratorCancellation] CancellationToken cancellationToken = default)
    {
        var buf = new Completion[64];
        while (true)
        {
            int n = await WaitCompletionsAsync(buf, cancellationToken).ConfigureAwait(false);
            for (int i = 0; i < n; i++) yield return buf[i];
        }
    }

    /// <summary>Frames submitted and not yet completed.</summary>
    public unsafe int InFlight
    {
        get
        {
            uint n;
            Native.Check(Native.fl_in_flight(Handle, &n), "fl_in_flight");
            return (int)n;
        }
    }
}

/// <summary>
/// A producer slot, held from Acquire until <see cref="Submit"/> or <see cref="Dispose"/> (which gives
/// it back unsent). <see cref="Span"/> and <see cref="Memory"/> are the slot itself in shared memory;
/// after the lease ends both refuse to hand out the memory again (a span taken earlier must not be
/// kept: the slot may hold another frame by then).
/// </summary>
public sealed unsafe class ProducerLease : IDisposable
{
    private readonly FrameLinkProducer producer;
    private readonly byte* data;
    private readonly int capacity;
    private readonly uint slot;
    private readonly int generation;
    private byte[]? attributes;
    private LeaseMemory? memory;
    private int ended; // 0 active, 1 submitted, 2 abandoned

    internal ProducerLease(FrameLinkProducer producer, FlSlot s, int generation)
    {
        this.producer = producer;
        this.generation = generation;
        data = s.Data;
        capacity = (int)Math.Min(s.Capacity, int.MaxValue);
        slot = s.Index;
        TimestampNs = FrameLinkLibrary.NowNs();
    }

    public int SlotIndex => (int)slot;
    public int Capacity => capacity;
    public bool IsActive => Volatile.Read(ref ended) == 0 && generation == producer.Generation;

    /// <summary>The whole slot (Capacity bytes), writable, no copy.</summary>
    public Span<byte> Span
    {
        get
        {
            ThrowIfEnded();
            return new Span<byte>(data, capacity);
        }
    }

    /// <summary>The slot as Memory, for code that awaits while writing; unusable once the lease ends.</summary>
    public Memory<byte> Memory
    {
        get
        {
            ThrowIfEnded();
            return (memory ??= new LeaseMemory(this)).Memory;
        }
    }

    public ulong FrameId { get; set; }
    /// <summary>The application's own grouping of frames (a wafer, a batch, a scan), carried as it is.</summary>
    public ulong GroupId { get; set; }
    /// <summary>Nanoseconds since the Unix epoch; defaults to the acquire time.</summary>
    public ulong TimestampNs { get; set; }
    public DateTimeOffset Timestamp
    {
        get => DateTimeOffset.UnixEpoch.AddTicks((long)(TimestampNs / 100));
        set => TimestampNs = (ulong)(value - DateTimeOffset.UnixEpoch).Ticks * 100;
    }
    /// <summary>Ask the daemon to send a CRC32C of the payload, checked by the receiving daemon.</summary>
    public bool Crc32c { get; set; }

    /// <summary>Up to 192 bytes of user attributes sent in the frame header.</summary>
    public void SetAttributes(ReadOnlySpan<byte> value)
    {
        if (value.Length > Native.MaxAttrBytes)
            throw new ArgumentException($"attributes are {value.Length} bytes, at most {Native.MaxAttrBytes} fit in a frame header; " +
                                        "send larger metadata inside the payload", nameof(value));
        attributes = value.ToArray();
    }

    public void SetAttributes(string value) => SetAttributes(Encoding.UTF8.GetBytes(value));

    /// <summary>Sends the first <paramref name="length"/> bytes of the slot with the metadata set on this lease.</summary>
    public void Submit(int length)
    {
        ThrowIfEnded();
        if ((uint)length > (uint)capacity)
            throw new ArgumentOutOfRangeException(nameof(length), length, $"the slot holds {capacity} bytes; attach with a larger SlotSize");
        var h = producer.NativeHandle;
        fixed (byte* a = attributes)
        {
            var meta = new FlFrameMeta
            {
                FrameId = FrameId,
                GroupId = GroupId,
                TimestampNs = TimestampNs,
                Flags = Crc32c ? Native.MetaCrc32c : 0,
                AttrLength = (uint)(attributes?.Length ?? 0),
                Attrs = a,
            };
            Native.Check(Native.fl_set_meta(h, slot, &meta), $"cannot set the metadata of frame {FrameId}");
        }
        int rc = Native.fl_submit(h, slot, (ulong)length);
        if (rc != 0) throw Native.Error(rc, $"cannot submit frame {FrameId}");
        Volatile.Write(ref ended, 1);
    }

    /// <summary>Gives the slot back unsent when it was not submitted; does nothing afterwards.</summary>
    public void Dispose()
    {
        if (Interlocked.CompareExchange(ref ended, 2, 0) != 0) return;
        if (generation != producer.Generation) return; // its attachment, and the slot, are gone
        try
        {
            Native.fl_abandon(producer.NativeHandle, slot);
        }
        catch (ObjectDisposedException)
        {
            // The producer is gone; its slots went with it.
        }
    }

    internal void ThrowIfEnded()
    {
        if (generation != producer.Generation)
            throw new ObjectDisposedException(nameof(ProducerLease),
                $"slot {slot} belonged to the attachment before the producer reattached to a restarted daemon; acquire a new lease");
        int e = Volatile.Read(ref ended);
        if (e != 0)
            throw new ObjectDisposedException(nameof(ProducerLease),
                $"slot {slot} was already {(e == 1 ? "submitted" : "given back")}; acquire a new lease");
    }

    internal byte* Pointer => data;

    private sealed class LeaseMemory : MemoryManager<byte>
    {
        private readonly ProducerLease lease;
        public LeaseMemory(ProducerLease lease) => this.lease = lease;
        public override Span<byte> GetSpan() => lease.Span;
        public override MemoryHandle Pin(int elementIndex = 0)
        {
            lease.ThrowIfEnded();
            if ((uint)elementIndex > (uint)lease.capacity) throw new ArgumentOutOfRangeException(nameof(elementIndex));
            return new MemoryHandle(lease.data + elementIndex); // shared memory: the GC never moves it
        }
        public override void Unpin() { }
        protected override void Dispose(bool disposing) { }
    }
}
