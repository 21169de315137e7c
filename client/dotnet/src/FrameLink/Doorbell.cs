using System.Runtime.InteropServices;

namespace FrameLink;

/// <summary>
/// Async waits on the client's doorbell fd (fl_doorbell_fd) without timers: one dedicated thread per client
/// blocks in poll(2) on it while someone awaits, and completes every waiter when it becomes readable. The
/// waiter then retries its non-blocking fl_* call, which re-arms the doorbell when it finds nothing. The fd
/// is also readable when the daemon goes away (and, with AutoReattach, when the next attempt is due), so the
/// retried call reports that or attaches again; it stays the same fd across reattachments.
/// </summary>
internal sealed unsafe class Doorbell : IDisposable
{
    private readonly int doorbellFd;
    private readonly int wakeFd; // our own eventfd: new waiter or dispose
    private readonly object gate = new();
    private readonly List<TaskCompletionSource> waiters = new();
    private Thread? thread;
    private bool disposed;

    public Doorbell(SafeClientHandle client)
    {
        doorbellFd = Native.fl_doorbell_fd(client);
        if (doorbellFd < 0) throw Native.Error((int)FrameLinkStatus.InvalidArgument, "fl_doorbell_fd");
        wakeFd = Libc.eventfd(0, Libc.EFD_CLOEXEC | Libc.EFD_NONBLOCK);
        if (wakeFd < 0)
            throw new FrameLinkException(FrameLinkStatus.Resources,
                $"eventfd() failed (errno {Marshal.GetLastPInvokeError()}): raise the process's file descriptor limit");
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
            waiters.Add(tcs);
            if (thread == null)
            {
                thread = new Thread(Run) { IsBackground = true, Name = "framelink-doorbell" };
                thread.Start();
            }
        }
        Kick();
        if (!ct.CanBeCanceled) return tcs.Task;
        var reg = ct.Register(static s => ((TaskCompletionSource)s!).TrySetCanceled(), tcs);
        tcs.Task.ContinueWith(static (_, r) => ((CancellationTokenRegistration)r!).Dispose(), reg,
            TaskContinuationOptions.ExecuteSynchronously);
        return tcs.Task;
    }

    private void Kick()
    {
        ulong one = 1;
        Libc.write(wakeFd, &one, 8);
    }

    private void Run()
    {
        var fds = stackalloc Libc.PollFd[2];
        ulong drain;
        while (true)
        {
            bool anyone;
            lock (gate)
            {
                if (disposed) return;
                waiters.RemoveAll(static t => t.Task.IsCompleted); // cancelled ones
                anyone = waiters.Count > 0;
            }
            fds[0] = new Libc.PollFd { Fd = wakeFd, Events = Libc.POLLIN };
            fds[1] = new Libc.PollFd { Fd = doorbellFd, Events = Libc.POLLIN };
            int n = Libc.poll(fds, anyone ? 2u : 1u, -1);
            if (n < 0) continue; // EINTR
            if ((fds[0].Revents & Libc.POLLIN) != 0) Libc.read(wakeFd, &drain, 8);
            if (!anyone || fds[1].Revents == 0) continue;
            TaskCompletionSource[] ready;
            lock (gate)
            {
                ready = waiters.ToArray();
                waiters.Clear();
            }
            foreach (var t in ready) t.TrySetResult();
        }
    }

    public void Dispose()
    {
        Thread? t;
        TaskCompletionSource[] left;
        lock (gate)
        {
            if (disposed) return;
            disposed = true;
            t = thread;
            left = waiters.ToArray();
            waiters.Clear();
        }
        Kick();
        t?.Join(TimeSpan.FromSeconds(5));
        Libc.close(wakeFd);
        foreach (var w in left)
            w.TrySetException(new ObjectDisposedException("FrameLink client", "the client was disposed while this call waited"));
    }
}
