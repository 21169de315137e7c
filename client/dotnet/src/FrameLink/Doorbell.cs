using System.Collections.Concurrent;
using System.Runtime.InteropServices;

namespace FrameLink;

/// <summary>
/// Async waits on the client's doorbell fd (fl_doorbell_fd) without timers and without a thread per client:
/// a waiter arms the fd in the process's one epoll set (<see cref="DoorbellPoller"/>), and the poller's thread
/// completes every waiter of a doorbell when it becomes readable. The waiter then retries its non-blocking
/// fl_* call, which re-arms the doorbell when it finds nothing. The fd is also readable when the daemon goes
/// away (and, with AutoReattach, when the next attempt is due), so the retried call reports that or attaches
/// again; it stays the same fd across reattachments.
/// </summary>
internal sealed class Doorbell : IDisposable
{
    // Waiters whose token was cancelled stay in the list until the doorbell rings; past this many the
    // list is pruned when the next one arrives, so a loop of cancelled waits holds no memory.
    private const int PruneAbove = 16;

    private readonly int doorbellFd;
    private readonly ulong key;
    private readonly object gate = new();
    private readonly List<TaskCompletionSource> waiters = new();
    private bool armed;
    private bool registered;
    private bool disposed;

    public Doorbell(SafeClientHandle client)
    {
        doorbellFd = Native.fl_doorbell_fd(client);
        if (doorbellFd < 0) throw Native.Error((int)FrameLinkStatus.InvalidArgument, "fl_doorbell_fd");
        key = DoorbellPoller.Register(this);
    }

    public int Fd => doorbellFd;

    /// <summary>Completes when the doorbell rang (or the daemon is gone); the caller then retries.</summary>
    public Task WaitAsync(CancellationToken ct)
    {
        if (ct.IsCancellationRequested) return Task.FromCanceled(ct);
        var tcs = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        lock (gate)
        {
            ObjectDisposedException.ThrowIf(disposed, this);
            if (waiters.Count > PruneAbove) waiters.RemoveAll(static t => t.Task.IsCompleted);
            waiters.Add(tcs);
            if (!armed)
            {
                DoorbellPoller.Arm(doorbellFd, key, registered);
                armed = registered = true;
            }
        }
        if (!ct.CanBeCanceled) return tcs.Task;
        var reg = ct.Register(static s => ((TaskCompletionSource)s!).TrySetCanceled(), tcs);
        tcs.Task.ContinueWith(static (_, r) => ((CancellationTokenRegistration)r!).Dispose(), reg,
            TaskContinuationOptions.ExecuteSynchronously);
        return tcs.Task;
    }

    /// <summary>The poller's thread: the fd is readable (its one-shot registration is now disarmed).</summary>
    internal void Ring()
    {
        TaskCompletionSource[] ready;
        lock (gate)
        {
            armed = false;
            if (disposed) return;
            ready = waiters.ToArray();
            waiters.Clear();
        }
        foreach (var t in ready) t.TrySetResult();
    }

    public void Dispose()
    {
        TaskCompletionSource[] left;
        lock (gate)
        {
            if (disposed) return;
            disposed = true;
            // Out of the epoll set before the client closes the fd: a later fd of the same number is
            // never watched for this doorbell.
            DoorbellPoller.Unregister(doorbellFd, key, registered);
            left = waiters.ToArray();
            waiters.Clear();
        }
        foreach (var w in left)
            w.TrySetException(new ObjectDisposedException("FrameLink client", "the client was disposed while this call waited"));
    }
}

/// <summary>
/// One epoll set and one thread for every doorbell of the process, started at the first client. Each
/// doorbell fd is registered one-shot (EPOLLONESHOT) while someone awaits it, so an fd nobody waits on
/// costs nothing and an fd that stays readable does not spin the thread. The thread only completes
/// tasks; their continuations run on the thread pool.
/// </summary>
internal static unsafe class DoorbellPoller
{
    private const int EventsPerWait = 64;
    private static readonly ConcurrentDictionary<ulong, Doorbell> Doorbells = new();
    private static readonly Lazy<int> Epoll = new(Start, LazyThreadSafetyMode.ExecutionAndPublication);
    private static long nextKey;

    // struct epoll_event is packed on x86-64 (12 bytes: events at 0, data at 4); elsewhere 16 bytes (data at 8).
    private static readonly bool Packed = RuntimeInformation.ProcessArchitecture == Architecture.X64;
    private static int Stride => Packed ? 12 : 16;
    private static int DataOffset => Packed ? 4 : 8;

    internal static ulong Register(Doorbell doorbell)
    {
        _ = Epoll.Value;
        ulong key = (ulong)Interlocked.Increment(ref nextKey);
        Doorbells[key] = doorbell;
        return key;
    }

    internal static void Arm(int fd, ulong key, bool modify)
    {
        byte* ev = stackalloc byte[16];
        *(uint*)ev = Libc.EPOLLIN | Libc.EPOLLONESHOT;
        *(ulong*)(ev + DataOffset) = key;
        if (Libc.epoll_ctl(Epoll.Value, modify ? Libc.EPOLL_CTL_MOD : Libc.EPOLL_CTL_ADD, fd, ev) == 0) return;
        throw new FrameLinkException(FrameLinkStatus.Resources,
            $"epoll_ctl() of the doorbell fd {fd} failed (errno {Marshal.GetLastPInvokeError()})");
    }

    internal static void Unregister(int fd, ulong key, bool registered)
    {
        if (registered) Libc.epoll_ctl(Epoll.Value, Libc.EPOLL_CTL_DEL, fd, null);
        Doorbells.TryRemove(key, out _);
    }

    private static int Start()
    {
        int epfd = Libc.epoll_create1(Libc.EPOLL_CLOEXEC);
        if (epfd < 0)
            throw new FrameLinkException(FrameLinkStatus.Resources,
                $"epoll_create1() failed (errno {Marshal.GetLastPInvokeError()}): raise the process's file descriptor limit");
        new Thread(() => Run(epfd)) { IsBackground = true, Name = "framelink-doorbell" }.Start();
        return epfd;
    }

    private static void Run(int epfd)
    {
        byte* events = stackalloc byte[EventsPerWait * 16];
        while (true)
        {
            int n = Libc.epoll_wait(epfd, events, EventsPerWait, -1);
            for (int i = 0; i < n; i++)
            {
                ulong key = *(ulong*)(events + i * Stride + DataOffset);
                if (Doorbells.TryGetValue(key, out var doorbell)) doorbell.Ring();
            }
        }
    }
}
