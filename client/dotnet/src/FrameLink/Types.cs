using System.Runtime.InteropServices;

namespace FrameLink;

/// <summary>fl_status from framelink.h.</summary>
public enum FrameLinkStatus
{
    Ok = 0,
    Again = 1,
    TimedOut = 2,
    InvalidArgument = 3,
    Interrupted = 4,
    Busy = 5,
    BadSlot = 100,
    SlotNotOwned = 101,
    TooLarge = 102,
    BadMetadata = 103,
    BadDescriptor = 104,
    DoubleRelease = 105,
    NoConsumer = 106,
    FrameTimeout = 107,
    PeerRejected = 108,
    CrcMismatch = 109,
    NoRoute = 110,
    LinkLost = 111,
    Shutdown = 112,
    NoLink = 113,
    DaemonUnreachable = 200,
    AttachRefused = 201,
    Quota = 202,
    Version = 203,
    BadRequest = 204,
    DaemonGone = 205,
    Resources = 206,
    RingCorrupt = 207,
    Limit = 208,
    Auth = 300,
    PeerVersion = 301,
    Protocol = 302,
    UnknownStream = 303,
    UnknownCredit = 304,
    Transport = 400,
    Device = 401,
}

/// <summary>A libframelink call failed. The message says what was wrong and what to do.</summary>
public sealed class FrameLinkException : Exception
{
    public FrameLinkException(FrameLinkStatus status, string message) : base(message) => Status = status;
    public FrameLinkStatus Status { get; }
}

/// <summary>Attach options; every field has a default.</summary>
public sealed record FrameLinkOptions
{
    /// <summary>The daemon's Unix socket; null: $FRAMELINK_SOCKET, else /run/framelink/framelinkd.sock.</summary>
    public string? SocketPath { get; init; }
    /// <summary>Slots to ask for; 0: the daemon's configured default ([limits] default_slot_count, 8 unless set).</summary>
    public int SlotCount { get; init; }
    /// <summary>Bytes per slot; 0: the daemon's configured default ([limits] default_slot_size, 4 MiB unless set).</summary>
    public long SlotSize { get; init; }
    /// <summary>Shown in the daemon's logs; null: the program name.</summary>
    public string? ClientName { get; init; }
    /// <summary>
    /// When the daemon goes away, attach again by itself (<see cref="FrameLinkClient.Reattach"/>) as soon as
    /// it is back, instead of throwing <see cref="FrameLinkStatus.DaemonGone"/>: until then no slot and no
    /// frame are available. Leases and frames from before become unusable; a frame that was in flight
    /// completes with DaemonGone (it may or may not have been delivered). This is libframelink's
    /// auto_reattach option: the library makes the attempts, at most one per <see cref="ReattachIntervalMs"/>.
    /// On by default, so that a daemon restart is a pause (the environment variable FRAMELINK_AUTO_REATTACH=0
    /// turns the default off); false: calls throw DaemonGone and the caller reattaches.
    /// </summary>
    public bool AutoReattach { get; init; } = true;
    /// <summary>With AutoReattach, the least time between two attempts; 0: the library default (200 ms).</summary>
    public int ReattachIntervalMs { get; init; }
    /// <summary>
    /// Bounds connecting to the daemon and waiting for its answer, in attach and reattach;
    /// 0: the library default (10 s). Past it the attach fails with DaemonUnreachable, saying which step.
    /// </summary>
    public int AttachTimeoutMs { get; init; }
    /// <summary>
    /// Consumers: true to subscribe, getting every frame of the stream; false (the default) to join the
    /// stream's queue group, whose members share the frames (each frame to one of them). Frames of a producer
    /// on the same host are not copied either way: the frame's data is the producer's slot, read-only.
    /// Producers: must stay false.
    /// </summary>
    public bool Subscribe { get; init; }
    /// <summary>
    /// Consumers: true to have the stream's frames from other hosts pulled to this host while this consumer is
    /// attached (the sender offers each one, this host's daemon reads it when a slot is free: RDMA READ on rdma),
    /// as if the daemon's pull_streams listed the stream; false (the default): as the daemon is configured.
    /// Producers: must stay false.
    /// </summary>
    public bool Pull { get; init; }
    /// <summary>
    /// How long, in microseconds, a blocking call (Acquire, Receive, WaitCompletions) that finds nothing keeps
    /// looking before it sleeps, yielding the CPU between looks: while frames flow, the next one usually comes
    /// within it and costs no wake-up. 0: the library default (20 µs, or $FRAMELINK_WAIT_SPIN_US when set);
    /// -1: sleep at once; at most 1,000,000.
    /// </summary>
    public int WaitSpinMicroseconds { get; init; }
}

/// <summary>What the daemon granted at attach. Generation counts the reattachments.</summary>
public readonly record struct ClientInfo(ulong ClientId, long SlotSize, int SlotCount, ulong DaemonPid, bool DataOnHugepages,
                                         int Generation = 0);

/// <summary>One per submitted frame: delivered (Status Ok) or why it failed. Layout of fl_completion.</summary>
[StructLayout(LayoutKind.Sequential)]
public readonly struct Completion
{
    private readonly uint slot;
    private readonly int status;
    private readonly ulong sequence;
    private readonly ulong frameId;
    private readonly ulong length;
    private readonly uint readers;
    private readonly uint released;

    public int Slot => (int)slot;
    public FrameLinkStatus Status => (FrameLinkStatus)status;
    public ulong Sequence => sequence;
    public ulong FrameId => frameId;
    public long Length => (long)length;
    /// <summary>The readers the frame was meant for, on every host (subscribers, and one member of the queue group).</summary>
    public int Readers => (int)readers;
    /// <summary>Of those, how many released it: all of them when delivered, but for <see cref="Skipped"/>.</summary>
    public int Released => (int)released;
    /// <summary>Delivered: the subscribers of a drop stream skipped for this frame (they fell behind; each is told the gap).</summary>
    public int Skipped => status == 0 ? (int)(readers - released) : 0;
    public bool Delivered => status == 0;
    /// <summary>"FL_ERR_...: what it means", from fl_status_str.</summary>
    public unsafe string Reason => Marshal.PtrToStringUTF8((IntPtr)Native.fl_status_str(status)) ?? status.ToString();
    public override string ToString() => $"frame {FrameId}: {(Delivered ? "delivered" : Reason)}";
}

public static class FrameLinkLibrary
{
    /// <summary>Version of the loaded libframelink.</summary>
    public static unsafe string Version => Marshal.PtrToStringUTF8((IntPtr)Native.fl_version()) ?? "";

    /// <summary>CRC32C (Castagnoli) as the daemon computes it.</summary>
    public static unsafe uint Crc32c(ReadOnlySpan<byte> data, uint seed = 0)
    {
        fixed (byte* p = data) return Native.fl_crc32c(seed, p, (nuint)data.Length);
    }

    internal static ulong NowNs() => (ulong)(DateTimeOffset.UtcNow - DateTimeOffset.UnixEpoch).Ticks * 100;
}
