using System.Diagnostics;
using System.Runtime.InteropServices;
using System.Text.RegularExpressions;

namespace FrameLink.Tests;

/// <summary>The managed mirrors match include/framelink/framelink.h as a C compiler lays it out.</summary>
public sealed class AbiTests
{
    private static readonly string Header = Path.Combine(Repo.Root, "include", "framelink", "framelink.h");

    private static readonly (string C, Type T, string[] Fields)[] Structs =
    [
        ("fl_client_options", typeof(FlClientOptions), ["struct_size", "role", "socket_path", "stream", "client_name", "slot_count", "attach_timeout_ms", "slot_size", "auto_reattach", "reattach_interval_ms", "subscribe", "completion_size", "pull", "wait_spin_us"]),
        ("fl_client_info", typeof(FlClientInfo), ["client_id", "slot_size", "slot_count", "role", "daemon_pid", "daemon_start_ns", "data_on_hugepages", "generation"]),
        ("fl_slot", typeof(FlSlot), ["index", "reserved", "data", "capacity"]),
        ("fl_frame_meta", typeof(FlFrameMeta), ["frame_id", "group_id", "timestamp_ns", "flags", "attr_length", "attrs"]),
        ("fl_completion", typeof(Completion), ["slot", "status", "sequence", "frame_id", "length", "readers", "released"]),
        ("fl_frame", typeof(FlFrame), ["slot", "flags", "sequence", "data", "length", "frame_id", "group_id", "timestamp_ns", "crc32c", "attr_length", "attrs"]),
    ];

    private static readonly Dictionary<string, FrameLinkStatus> StatusNames = new()
    {
        ["FL_OK"] = FrameLinkStatus.Ok, ["FL_EAGAIN"] = FrameLinkStatus.Again, ["FL_ETIMEDOUT"] = FrameLinkStatus.TimedOut,
        ["FL_EINVAL"] = FrameLinkStatus.InvalidArgument, ["FL_EINTR"] = FrameLinkStatus.Interrupted, ["FL_EBUSY"] = FrameLinkStatus.Busy,
        ["FL_ERR_BAD_SLOT"] = FrameLinkStatus.BadSlot, ["FL_ERR_SLOT_NOT_OWNED"] = FrameLinkStatus.SlotNotOwned,
        ["FL_ERR_TOO_LARGE"] = FrameLinkStatus.TooLarge, ["FL_ERR_BAD_METADATA"] = FrameLinkStatus.BadMetadata,
        ["FL_ERR_BAD_DESCRIPTOR"] = FrameLinkStatus.BadDescriptor, ["FL_ERR_DOUBLE_RELEASE"] = FrameLinkStatus.DoubleRelease,
        ["FL_ERR_NO_CONSUMER"] = FrameLinkStatus.NoConsumer, ["FL_ERR_TIMEOUT"] = FrameLinkStatus.FrameTimeout,
        ["FL_ERR_PEER_REJECTED"] = FrameLinkStatus.PeerRejected, ["FL_ERR_CRC_MISMATCH"] = FrameLinkStatus.CrcMismatch,
        ["FL_ERR_NO_ROUTE"] = FrameLinkStatus.NoRoute, ["FL_ERR_LINK_LOST"] = FrameLinkStatus.LinkLost,
        ["FL_ERR_SHUTDOWN"] = FrameLinkStatus.Shutdown, ["FL_ERR_NO_LINK"] = FrameLinkStatus.NoLink,
        ["FL_ERR_DAEMON_UNREACHABLE"] = FrameLinkStatus.DaemonUnreachable,
        ["FL_ERR_ATTACH_REFUSED"] = FrameLinkStatus.AttachRefused, ["FL_ERR_QUOTA"] = FrameLinkStatus.Quota,
        ["FL_ERR_VERSION"] = FrameLinkStatus.Version, ["FL_ERR_BAD_REQUEST"] = FrameLinkStatus.BadRequest,
        ["FL_ERR_DAEMON_GONE"] = FrameLinkStatus.DaemonGone, ["FL_ERR_RESOURCES"] = FrameLinkStatus.Resources,
        ["FL_ERR_RING_CORRUPT"] = FrameLinkStatus.RingCorrupt, ["FL_ERR_LIMIT"] = FrameLinkStatus.Limit, ["FL_ERR_AUTH"] = FrameLinkStatus.Auth,
        ["FL_ERR_PEER_VERSION"] = FrameLinkStatus.PeerVersion, ["FL_ERR_PROTOCOL"] = FrameLinkStatus.Protocol,
        ["FL_ERR_UNKNOWN_STREAM"] = FrameLinkStatus.UnknownStream, ["FL_ERR_UNKNOWN_CREDIT"] = FrameLinkStatus.UnknownCredit,
        ["FL_ERR_TRANSPORT"] = FrameLinkStatus.Transport, ["FL_ERR_DEVICE"] = FrameLinkStatus.Device,
    };

    private static readonly string[] Defines = ["FL_WAIT_SPIN_OFF"];

    private static readonly Lazy<Dictionary<string, long>> CLayout = new(Probe);

    private static Dictionary<string, long> Probe()
    {
        var names = Regex.Matches(File.ReadAllText(Header), @"^\s*(FL_[A-Z0-9_]+)\s*=", RegexOptions.Multiline).Select(m => m.Groups[1].Value);
        var src = new List<string> { "#include <stdio.h>", "#include <stddef.h>", "#include \"framelink/framelink.h\"", "int main(void) {" };
        foreach (var (c, _, fields) in Structs)
        {
            src.Add($"printf(\"size {c} %zu\\n\", sizeof({c}));");
            foreach (var f in fields) src.Add($"printf(\"offset {c}.{f} %zu\\n\", offsetof({c}, {f}));");
        }
        foreach (var n in names) src.Add($"printf(\"enum {n} %d\\n\", (int)({n}));");
        foreach (var n in Defines) src.Add($"printf(\"define {n} %lld\\n\", (long long)({n}));");
        src.Add("return 0; }");
        var dir = Directory.CreateTempSubdirectory("fl-abi.").FullName;
        try
        {
            File.WriteAllLines(Path.Combine(dir, "probe.c"), src);
            Run("cc", ["-std=c11", "-I", Path.Combine(Repo.Root, "include"), Path.Combine(dir, "probe.c"), "-o", Path.Combine(dir, "probe")]);
            return Run(Path.Combine(dir, "probe"), []).Split('\n', StringSplitOptions.RemoveEmptyEntries)
                .Select(l => (Key: l[..l.LastIndexOf(' ')], Value: long.Parse(l[(l.LastIndexOf(' ') + 1)..])))
                .ToDictionary(p => p.Key, p => p.Value);
        }
        finally { Directory.Delete(dir, true); }
    }

    private static string Run(string exe, string[] args)
    {
        var psi = new ProcessStartInfo(exe) { RedirectStandardOutput = true, RedirectStandardError = true };
        foreach (var a in args) psi.ArgumentList.Add(a);
        using var p = Process.Start(psi)!;
        string output = p.StandardOutput.ReadToEnd();
        string err = p.StandardError.ReadToEnd();
        p.WaitForExit();
        Assert.True(p.ExitCode == 0, $"{exe} failed ({p.ExitCode}): {err}");
        return output;
    }

    [Fact]
    public void StructSizesAndOffsetsMatchTheHeader()
    {
        var c = CLayout.Value;
        foreach (var (name, type, fields) in Structs)
        {
            Assert.Equal(c[$"size {name}"], Marshal.SizeOf(type));
            var managed = type.GetFields(System.Reflection.BindingFlags.Instance | System.Reflection.BindingFlags.Public | System.Reflection.BindingFlags.NonPublic);
            Assert.Equal(fields.Length, managed.Length);
            for (int i = 0; i < fields.Length; i++)
                Assert.True(c[$"offset {name}.{fields[i]}"] == (long)Marshal.OffsetOf(type, managed[i].Name),
                    $"{name}.{fields[i]} vs {type.Name}.{managed[i].Name}");
        }
    }

    [Fact]
    public void StatusValuesMatchTheHeader()
    {
        var statuses = CLayout.Value.Where(kv => kv.Key.StartsWith("enum FL_") && !kv.Key.StartsWith("enum FL_PRODUCER")
            && !kv.Key.StartsWith("enum FL_CONSUMER") && !kv.Key.StartsWith("enum FL_META_")).ToList();
        Assert.True(statuses.Count > 30);
        foreach (var (key, value) in statuses)
        {
            string name = key["enum ".Length..];
            Assert.True(StatusNames.TryGetValue(name, out var managed), $"{name} is in framelink.h but not in FrameLinkStatus");
            Assert.Equal(value, (long)managed);
        }
        Assert.Equal(statuses.Count, Enum.GetValues<FrameLinkStatus>().Length);
        Assert.Equal((long)Native.RoleProducer, CLayout.Value["enum FL_PRODUCER"]);
        Assert.Equal((long)Native.RoleConsumer, CLayout.Value["enum FL_CONSUMER"]);
        Assert.Equal((long)Native.MetaCrc32c, CLayout.Value["enum FL_META_CRC32C"]);
        Assert.Equal((long)Native.WaitSpinOff, CLayout.Value["define FL_WAIT_SPIN_OFF"]);
    }

    [Fact]
    public void TheBundledLibraryIsLoadedFirst()
    {
        var first = Native.Candidates(typeof(Native).Assembly).First();
        Assert.EndsWith(Path.Combine("runtimes", "linux-x64", "native", "libframelink.so.0"), first);
        Assert.Matches(@"^\d+\.\d+\.\d+", FrameLinkLibrary.Version);
        Assert.Equal(0xE3069283u, FrameLinkLibrary.Crc32c("123456789"u8));
    }
}
