using System.Diagnostics.CodeAnalysis;
using System.Reflection;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;

namespace FrameLink;

// Blittable mirrors of the structs in include/framelink/framelink.h (checked by the tests with a C compiler).
[StructLayout(LayoutKind.Sequential)]
internal unsafe struct FlClientOptions
{
    public uint StructSize;
    public uint Role;
    public byte* SocketPath;
    public byte* Stream;
    public byte* ClientName;
    public uint SlotCount;
    public uint AttachTimeoutMs;
    public ulong SlotSize;
    public uint AutoReattach;
    public uint ReattachIntervalMs;
    public uint Subscribe;
    public uint CompletionSize;
    public uint Pull;
    public uint WaitSpinUs;
}

[StructLayout(LayoutKind.Sequential)]
internal struct FlClientInfo
{
    public ulong ClientId;
    public ulong SlotSize;
    public uint SlotCount;
    public uint Role;
    public ulong DaemonPid;
    public ulong DaemonStartNs;
    public uint DataOnHugepages;
    public uint Generation;
}

[StructLayout(LayoutKind.Sequential)]
internal unsafe struct FlSlot
{
    public uint Index;
    public uint Reserved;
    public byte* Data;
    public ulong Capacity;
}

[StructLayout(LayoutKind.Sequential)]
internal unsafe struct FlFrameMeta
{
    public ulong FrameId;
    public ulong GroupId;
    public ulong TimestampNs;
    public uint Flags;
    public uint AttrLength;
    public byte* Attrs;
}

[StructLayout(LayoutKind.Sequential)]
internal unsafe struct FlFrame
{
    public uint Slot;
    public uint Flags;
    public ulong Sequence;
    public byte* Data;
    public ulong Length;
    public ulong FrameId;
    public ulong GroupId;
    public ulong TimestampNs;
    public uint Crc32c;
    public uint AttrLength;
    public byte* Attrs;
}

/// <summary>The one native handle: fl_client*, destroyed by fl_detach.</summary>
internal sealed class SafeClientHandle : SafeHandle
{
    public SafeClientHandle() : base(IntPtr.Zero, ownsHandle: true) { }
    public override bool IsInvalid => handle == IntPtr.Zero;
    protected override bool ReleaseHandle()
    {
        Native.fl_detach(handle);
        return true;
    }
}

internal static unsafe partial class Native
{
    internal const string Library = "framelink";
    internal const int MaxAttrBytes = 192;
    internal const uint MetaCrc32c = 1;
    internal const uint SlotHasCrc32c = 1;
    internal const uint SlotMaybeRedelivered = 2;
    internal const uint SlotGap = 8;
    internal const uint SlotGroupElsewhere = 16;
    internal const uint RoleProducer = 1;
    internal const uint RoleConsumer = 2;
    internal const uint WaitSpinOff = 0xFFFFFFFF;  // FL_WAIT_SPIN_OFF

    [LibraryImport(Library)] internal static partial byte* fl_version();
    [LibraryImport(Library)] internal static partial byte* fl_last_error();
    [LibraryImport(Library)] internal static partial byte* fl_status_str(int status);
    [LibraryImport(Library)] internal static partial void fl_client_options_init_size(FlClientOptions* options, nuint size);
    [LibraryImport(Library)] internal static partial int fl_attach(FlClientOptions* options, out SafeClientHandle client);
    [LibraryImport(Library)] internal static partial void fl_detach(IntPtr client);
    [LibraryImport(Library)] internal static partial int fl_client_get_info(SafeClientHandle client, FlClientInfo* info);
    [LibraryImport(Library)] internal static partial int fl_check_daemon(SafeClientHandle client);
    [LibraryImport(Library)] internal static partial int fl_reattach(SafeClientHandle client);
    [LibraryImport(Library)] internal static partial int fl_doorbell_fd(SafeClientHandle client);
    [LibraryImport(Library)] internal static partial uint fl_wait_spin_us(SafeClientHandle client);
    [LibraryImport(Library)] internal static partial int fl_acquire(SafeClientHandle client, int timeoutMs, FlSlot* slot);
    [LibraryImport(Library)] internal static partial int fl_set_meta(SafeClientHandle client, uint slot, FlFrameMeta* meta);
    [LibraryImport(Library)] internal static partial int fl_submit(SafeClientHandle client, uint slot, ulong length);
    [LibraryImport(Library)] internal static partial int fl_abandon(SafeClientHandle client, uint slot);
    [LibraryImport(Library)] internal static partial int fl_poll_completions(SafeClientHandle client, Completion* completions, nuint max, nuint* count);
    [LibraryImport(Library)] internal static partial int fl_wait_completions(SafeClientHandle client, Completion* completions, nuint max, nuint* count, int timeoutMs);
    [LibraryImport(Library)] internal static partial int fl_in_flight(SafeClientHandle client, uint* count);
    [LibraryImport(Library)] internal static partial int fl_receive(SafeClientHandle client, FlFrame* frame, int timeoutMs);
    [LibraryImport(Library)] internal static partial int fl_release(SafeClientHandle client, uint slot);
    [LibraryImport(Library)] internal static partial uint fl_frame_gap(SafeClientHandle client, uint slot);
    [LibraryImport(Library)] internal static partial uint fl_crc32c(uint seed, byte* data, nuint length);

    internal static string LastError() => Marshal.PtrToStringUTF8((IntPtr)fl_last_error()) ?? "";

    internal static FrameLinkException Error(int status, string what) =>
        new((FrameLinkStatus)status, $"{what}: {LastError()}");

    internal static void Check(int status, string what)
    {
        if (status != 0) throw Error(status, what);
    }

    // ---- library resolution ----
#pragma warning disable CA2255 // the resolver must be in place before the first P/Invoke of this assembly
    [ModuleInitializer]
#pragma warning restore CA2255
    internal static void InstallResolver() => NativeLibrary.SetDllImportResolver(typeof(Native).Assembly, Resolve);

    private static IntPtr Resolve(string name, Assembly assembly, DllImportSearchPath? searchPath)
    {
        if (name == Libc.Library)
        {
            return NativeLibrary.TryLoad("libc.so.6", out var libc) ? libc : IntPtr.Zero;
        }
        if (name != Library) return IntPtr.Zero;
        foreach (var candidate in Candidates(assembly))
        {
            if (NativeLibrary.TryLoad(candidate, out var h)) return h;
        }
        throw new DllNotFoundException(
            "libframelink not found. Looked for runtimes/linux-x64/native/libframelink.so.0 next to the FrameLink " +
            "assembly (builds in the framelink source tree put it there), then $FRAMELINK_LIBRARY" +
            (Environment.GetEnvironmentVariable("FRAMELINK_LIBRARY") is { Length: > 0 } env ? $" ({env})" : " (not set)") +
            ", then the system's libframelink.so.0. Install the system library (the libframelink0 package, " +
            "installed with framelinkd), or set FRAMELINK_LIBRARY to the path of libframelink.so.0.");
    }

    // Location is empty in a single-file or native AOT application (IL3000): then only
    // AppContext.BaseDirectory is looked in, which is what such an application has.
    [UnconditionalSuppressMessage("SingleFile", "IL3000", Justification = "an empty Location is skipped; AppContext.BaseDirectory follows")]
    internal static IEnumerable<string> Candidates(Assembly assembly)
    {
        var dirs = new List<string>();
        if (!string.IsNullOrEmpty(assembly.Location)) dirs.Add(Path.GetDirectoryName(assembly.Location)!);
        dirs.Add(AppContext.BaseDirectory);
        foreach (var dir in dirs.Distinct())
        {
            foreach (var file in new[] { "libframelink.so.0", "libframelink.so" })
            {
                var bundled = Path.Combine(dir, "runtimes", "linux-x64", "native", file);
                if (File.Exists(bundled)) yield return bundled;
                var flat = Path.Combine(dir, file); // RID-specific publish copies native assets flat
                if (File.Exists(flat)) yield return flat;
            }
        }
        var env = Environment.GetEnvironmentVariable("FRAMELINK_LIBRARY");
        if (!string.IsNullOrEmpty(env)) yield return env;
        yield return "libframelink.so.0";
    }
}

/// <summary>The few libc calls the doorbell poller needs (epoll on the doorbell fds; no protocol logic).</summary>
internal static unsafe partial class Libc
{
    internal const string Library = "libc";
    internal const uint EPOLLIN = 0x001;
    internal const uint EPOLLONESHOT = 1u << 30;
    internal const int EPOLL_CTL_ADD = 1;
    internal const int EPOLL_CTL_DEL = 2;
    internal const int EPOLL_CTL_MOD = 3;
    internal const int EPOLL_CLOEXEC = 0x80000;

    // event: struct epoll_event, laid out by DoorbellPoller (packed on x86-64).
    [LibraryImport(Library, SetLastError = true)] internal static partial int epoll_create1(int flags);
    [LibraryImport(Library, SetLastError = true)] internal static partial int epoll_ctl(int epfd, int op, int fd, void* ev);
    [LibraryImport(Library, SetLastError = true)] internal static partial int epoll_wait(int epfd, void* events, int maxevents, int timeout);
}
