using System.Diagnostics;
using System.Runtime.InteropServices;

namespace FrameLink;

/// <summary>What producer and consumer share: attach, info, the doorbell, bounded blocking waits.</summary>
public abstract unsafe class FrameLinkClient : IDisposable, IAsyncDisposable
{
    // Blocking calls wait in slices of at most this long so that a CancellationToken is seen promptly.
    private protected const int WaitSliceMs = 100;

    private protected readonly SafeClientHandle handle;
    private readonly Lazy<Doorbell> doorbell;
    private long doorbellWaits;

    private protected FrameLinkClient(string stream, FrameLinkOptions? options, uint role, string roleName)
    {
        ArgumentException.ThrowIfNullOrEmpty(stream);
        options ??= new FrameLinkOptions();
        if (options.SlotCount < 0) throw new ArgumentOutOfRangeException(nameof(options), "SlotCount must be >= 0 (0: the default)");
        if (options.SlotSize < 0) throw new ArgumentOutOfRangeException(nameof(options), "SlotSize must be >= 0 (0: the default)");
        if (options.AttachTimeoutMs < 0) throw new ArgumentOutOfRangeException(nameof(options), "AttachTimeoutMs must be >= 0 (0: the default)");
        if (options.ReattachIntervalMs < 0) throw new ArgumentOutOfRangeException(nameof(options), "ReattachIntervalMs must be >= 0 (0: the default)");
        if (options.WaitSpinMicroseconds < -1) throw new ArgumentOutOfRangeException(nameof(options), "WaitSpinMicroseconds must be >= -1 (0: the default, -1: no spin)");
        Stream = stream;
        var o = new FlClientOptions();
        Native.fl_client_options_init_size(&o, (nuint)sizeof(FlClientOptions));
        o.CompletionSize = (uint)sizeof(Completion);  // Readers and Released are filled
        o.Role = role;
        o.SlotCount = (uint)options.SlotCount;
        o.SlotSize = (ulong)options.SlotSize;
        o.AttachTimeoutMs = (uint)options.AttachTimeoutMs;
        if (!options.AutoReattach) o.AutoReattach = 0;  // else as initialised: on unless $FRAMELINK_AUTO_REATTACH is off
        o.ReattachIntervalMs = (uint)options.ReattachIntervalMs;
        o.Subscribe = options.Subscribe ? 1u : 0u;
        o.Pull = options.Pull ? 1u : 0u;
        o.WaitSpinUs = options.WaitSpinMicroseconds < 0 ? Native.WaitSpinOff : (uint)options.WaitSpinMicroseconds;
        IntPtr s = Marshal.StringToCoTaskMemUTF8(stream);
        IntPtr sock = options.SocketPath is null ? IntPtr.Zero : Marshal.StringToCoTaskMemUTF8(options.SocketPath);
        IntPtr name = options.ClientName is null ? IntPtr.Zero : Marshal.StringToCoTaskMemUTF8(options.ClientName);
        try
        {
            o.Stream = (byte*)s;
            o.SocketPath = (byte*)sock;
            o.ClientName = (byte*)name;
            int rc = Native.fl_attach(&o, out handle);
            if (rc != 0)
            {
                handle.Dispose();
                throw Native.Error(rc, $"cannot attach {roleName} to stream '{stream}'");
            }
        }
        finally
        {
            Marshal.FreeCoTaskMem(s);
            if (sock != IntPtr.Zero) Marshal.FreeCoTaskMem(sock);
            if (name != IntPtr.Zero) Marshal.FreeCoTaskMem(name);
        }
        doorbell = new Lazy<Doorbell>(() => new Doorbell(handle), LazyThreadSafetyMode.ExecutionAndPublication);
    }

    private static ClientInfo ReadInfo(SafeClientHandle h)
    {
        FlClientInfo i;
        Native.Check(Native.fl_client_get_info(h, &i), "fl_client_get_info");
        return new ClientInfo(i.ClientId, (long)i.SlotSize, (int)i.SlotCount, i.DaemonPid, i.DataOnHugepages != 0, (int)i.Generation);
    }

    public string Stream { get; }
    /// <summary>The current attachment: a reattach (<see cref="Reattach"/> or AutoReattach) changes it.</summary>
    public ClientInfo Info => ReadInfo(Handle);
    public long SlotSize => Info.SlotSize;
    public int SlotCount => Info.SlotCount;
    /// <summary>How often this client attached again (<see cref="Reattach"/>); leases and frames belong to one generation.</summary>
    public int Generation => Info.Generation;

    /// <summary>
    /// How long, in microseconds, a wait of this client that finds nothing looks again before it sleeps
    /// (0: it sleeps at once): <see cref="FrameLinkOptions.WaitSpinMicroseconds"/>, else
    /// $FRAMELINK_WAIT_SPIN_US, else what the daemon advises for its host (its client_wait_spin_us), else 20.
    /// The async calls spin on the calling thread, before they return their task, as the blocking ones do;
    /// after a reattach the new daemon's advice applies. 0 with a libframelink older than 0.2, which cannot say.
    /// </summary>
    public int WaitSpinMicroseconds => (int)ResolvedSpin();

    // A libframelink older than 0.2 has no fl_wait_spin_us: with it the async calls do not spin, as before.
    private static volatile bool noSpinExport;

    private uint ResolvedSpin()
    {
        if (noSpinExport) return 0;
        try
        {
            return Native.fl_wait_spin_us(Handle);
        }
        catch (EntryPointNotFoundException)
        {
            noSpinExport = true;
            return 0;
        }
    }

    /// <summary>How often this client's async calls awaited the doorbell: a frame taken within the spin adds none.</summary>
    internal long DoorbellWaits => Interlocked.Read(ref doorbellWaits);

    /// <summary>Throws FrameLinkException(DaemonGone) when the daemon that served the attach is gone.</summary>
    public void CheckDaemon() => Native.Check(Native.fl_check_daemon(Handle), "framelinkd");

    /// <summary>
    /// Attaches this client again after its daemon restarted; does nothing while the daemon that served the
    /// attach still serves it. Throws (DaemonUnreachable ...) while no daemon accepts: call again later.
    /// Afterwards leases and frames from before are unusable (their memory is gone), a producer's frames that
    /// were in flight complete with DaemonGone, and <see cref="Info"/> describes the new attachment.
    /// </summary>
    public void Reattach() =>
        Native.Check(Native.fl_reattach(Handle), $"cannot reattach to the daemon of stream '{Stream}'");

    private protected SafeClientHandle Handle
    {
        get
        {
            ObjectDisposedException.ThrowIf(handle.IsClosed, this);
            return handle;
        }
    }

    private protected Task WaitDoorbellAsync(CancellationToken ct)
    {
        ObjectDisposedException.ThrowIf(handle.IsClosed, this);
        Interlocked.Increment(ref doorbellWaits);
        return doorbell.Value.WaitAsync(ct);
    }

    /// <summary>
    /// After a try found nothing: tries again for <see cref="WaitSpinMicroseconds"/>, yielding between tries, so
    /// that what comes meanwhile is taken without the daemon ringing the doorbell and this thread waking up
    /// (most of a small frame's cost). True when a try succeeded; false when the spin ran out, is 0, or
    /// <paramref name="ct"/> fired.
    /// </summary>
    private protected bool SpinFor(Func<bool> attempt, CancellationToken ct)
    {
        uint us = ResolvedSpin();
        if (us == 0) return false;
        long until = Stopwatch.GetTimestamp() + (long)(us * (double)Stopwatch.Frequency / 1_000_000);
        var spinner = new SpinWait();
        while (!ct.IsCancellationRequested)
        {
            spinner.SpinOnce(sleep1Threshold: -1);  // spins, then yields; never sleeps a millisecond
            if (attempt()) return true;
            if (Stopwatch.GetTimestamp() >= until) return false;
        }
        return false;
    }

    /// <summary>Runs attempt(ms) in slices until it returns true, the timeout passes (false) or ct fires.</summary>
    private protected static bool WaitInSlices(Func<int, bool> attempt, TimeSpan? timeout, CancellationToken ct)
    {
        long deadline = timeout is { } t ? Environment.TickCount64 + (long)Math.Max(0, t.TotalMilliseconds) : long.MaxValue;
        while (true)
        {
            ct.ThrowIfCancellationRequested();
            long left = deadline - Environment.TickCount64;
            int ms = left <= 0 ? 0 : (int)Math.Min(WaitSliceMs, left);
            if (attempt(ms)) return true;
            if (Environment.TickCount64 >= deadline) return false;
        }
    }

    /// <summary>Detaches: slots in flight end as the daemon decides (see the guide); pending async waits
    /// fail with <see cref="ObjectDisposedException"/>.</summary>
    public void Dispose()
    {
        if (doorbell.IsValueCreated) doorbell.Value.Dispose();
        handle.Dispose();
        GC.SuppressFinalize(this);
    }

    /// <summary>The same as <see cref="Dispose"/>, for <c>await using</c>: detaching does not block on the
    /// daemon (the doorbell has no thread of its own to join).</summary>
    public ValueTask DisposeAsync()
    {
        Dispose();
        return ValueTask.CompletedTask;
    }
}
