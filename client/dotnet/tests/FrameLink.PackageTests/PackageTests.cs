using System.IO.Compression;
using System.Reflection;
using System.Reflection.Metadata;
using System.Reflection.PortableExecutable;
using System.Runtime.CompilerServices;
using System.Text.Json;
using FrameLink.Examples;
using FrameLink.Tests;

namespace FrameLink.PackageTests;

internal static class Package
{
    public static readonly string Version = typeof(Package).Assembly.GetCustomAttributes<AssemblyMetadataAttribute>()
        .Single(a => a.Key == "FrameLinkVersion").Value!;

    public static string Nupkg => Path.Combine(
        Environment.GetEnvironmentVariable("FRAMELINK_NUGET_FEED") is { Length: > 0 } feed
            ? feed
            : throw new InvalidOperationException("FRAMELINK_NUGET_FEED is not set: it names the folder FrameLink was packed into"),
        $"FrameLink.{Version}.nupkg");

    public static string Library => Environment.GetEnvironmentVariable("FRAMELINK_LIBRARY")!;

#pragma warning disable CA2255 // before the first P/Invoke of FrameLink in this process
    [ModuleInitializer]
#pragma warning restore CA2255
    internal static void UseTheBuildTreesLibrary()
    {
        // The package carries no libframelink; on a machine without the system library (libframelink0)
        // the application names it, as these tests do with the build tree's.
        if (string.IsNullOrEmpty(Environment.GetEnvironmentVariable("FRAMELINK_LIBRARY")))
            Environment.SetEnvironmentVariable("FRAMELINK_LIBRARY", Path.Combine(Repo.BuildDir, "client", "libframelink.so.0"));
    }
}

/// <summary>What the .nupkg holds: the net10.0 build, its terms, readme and symbols, and no native library.</summary>
public sealed class PackageContentsTests
{
    [Fact]
    public void ThePackageHoldsTheNet10BuildItsTermsAndReadmeAndNoNativeLibrary()
    {
        using var zip = ZipFile.OpenRead(Package.Nupkg);
        var names = zip.Entries.Select(e => e.FullName).ToList();
        Assert.Contains("lib/net10.0/FrameLink.dll", names);
        Assert.Contains("lib/net10.0/FrameLink.xml", names); // IntelliSense docs
        Assert.DoesNotContain(names, n => n.StartsWith("lib/") && !n.StartsWith("lib/net10.0/")); // no framework it is not tested on
        Assert.DoesNotContain(names, n => n.StartsWith("runtimes/") || n.Contains("libframelink"));
        Assert.Contains("LICENSE", names);
        Assert.Contains("README.md", names);

        using var nuspec = new StreamReader(zip.GetEntry("FrameLink.nuspec")!.Open());
        string text = nuspec.ReadToEnd();
        Assert.Contains($"<version>{Package.Version}</version>", text);
        Assert.Contains("<id>FrameLink</id>", text);
        Assert.Contains("<license type=\"file\">LICENSE</license>", text);
        Assert.Contains("<readme>README.md</readme>", text);
        Assert.Contains("<authors>framelink maintainers</authors>", text);

        Assert.Equal((10, ".NETCoreApp,Version=v10.0"), Framework(zip, "lib/net10.0/FrameLink.dll"));
    }

    [Fact]
    public void TheSymbolsPackageHoldsThePortablePdb()
    {
        string snupkg = Path.ChangeExtension(Package.Nupkg, ".snupkg");
        Assert.True(File.Exists(snupkg), $"{snupkg} is missing: dotnet pack writes it beside the .nupkg (IncludeSymbols)");
        using var zip = ZipFile.OpenRead(snupkg);
        Assert.Contains("lib/net10.0/FrameLink.pdb", zip.Entries.Select(e => e.FullName));
    }

    [Fact]
    public void TheAssemblySaysItIsTrimmable()
    {
        // IsTrimmable stamps this on the assembly; the trimmer and the AOT compiler read it.
        var trimmable = typeof(FrameLinkProducer).Assembly.GetCustomAttributes<AssemblyMetadataAttribute>()
            .SingleOrDefault(a => a.Key == "IsTrimmable");
        Assert.Equal("True", trimmable?.Value);
    }

    /// <summary>The major version of System.Runtime the assembly was compiled against, and its TargetFramework.</summary>
    private static (int, string) Framework(ZipArchive zip, string entry)
    {
        using var ms = new MemoryStream();
        using (var s = zip.GetEntry(entry)!.Open()) s.CopyTo(ms);
        ms.Position = 0;
        using var pe = new PEReader(ms);
        var md = pe.GetMetadataReader();
        int runtime = md.AssemblyReferences.Select(md.GetAssemblyReference)
            .Single(r => md.GetString(r.Name) == "System.Runtime").Version.Major;
        string? framework = null;
        foreach (var h in md.GetAssemblyDefinition().GetCustomAttributes())
        {
            var attr = md.GetCustomAttribute(h);
            var ctor = md.GetMemberReference((MemberReferenceHandle)attr.Constructor);
            var type = md.GetTypeReference((TypeReferenceHandle)ctor.Parent);
            if (md.GetString(type.Name) != "TargetFrameworkAttribute") continue;
            var blob = md.GetBlobReader(attr.Value);
            blob.ReadUInt16(); // prolog
            framework = blob.ReadSerializedString();
        }
        return (runtime, framework ?? "");
    }
}

/// <summary>An application of the package: producer -> daemon A -> tcp -> daemon B -> consumer.</summary>
[Collection("daemons")]
public sealed class PackageRoundTripTests
{
    private const int Size = 256 * 1024;
    private readonly DaemonPair pair;

    public PackageRoundTripTests(DaemonPair pair) => this.pair = pair;

    [Fact]
    public void FrameLinkIsThePackageAndLibframelinkComesFromFrameLinkLibrary()
    {
        // The test's deps.json says how FrameLink got here: a package of this version, not a project.
        string deps = Path.Combine(AppContext.BaseDirectory, "FrameLink.PackageTests.deps.json");
        using var doc = JsonDocument.Parse(File.ReadAllText(deps));
        var library = doc.RootElement.GetProperty("libraries").GetProperty($"FrameLink/{Package.Version}");
        Assert.Equal("package", library.GetProperty("type").GetString());
        Assert.Equal($"framelink/{Package.Version}", library.GetProperty("path").GetString());
        Assert.Empty(Directory.GetFiles(AppContext.BaseDirectory, "libframelink*", SearchOption.AllDirectories));

        Assert.Matches(@"^\d+\.\d+\.\d+", FrameLinkLibrary.Version); // loads the library
        var mapped = File.ReadAllLines("/proc/self/maps").Select(l => l.Split(' ', StringSplitOptions.RemoveEmptyEntries))
            .Where(f => f.Length >= 6 && f[5].Contains("libframelink")).Select(f => f[5]).Distinct().ToList();
        Assert.Equal([Path.GetFullPath(new FileInfo(Package.Library).ResolveLinkTarget(true)?.FullName ?? Package.Library)], mapped);
    }

    [Fact]
    public async Task ProducerToConsumerThroughTwoDaemons()
    {
        const int n = 12;
        const string stream = "cs-package-round-trip";
        using var consumer = new FrameLinkConsumer(stream, new() { SocketPath = pair.SocketB, SlotCount = 4, SlotSize = Size });
        using var producer = new FrameLinkProducer(stream, new() { SocketPath = pair.SocketA, SlotCount = 4, SlotSize = Size });
        using var cts = new CancellationTokenSource(TimeSpan.FromSeconds(60));

        var received = Task.Run(async () =>
        {
            var seen = new List<(ulong Id, ulong Wafer, string Attrs, int Length, int Bad)>();
            await foreach (var f in consumer.ReadAllAsync(cts.Token))
            {
                using (f) seen.Add((f.FrameId, f.GroupId, f.AttributesText, f.Length, FramePattern.Mismatch(f.FrameId, f.Span)));
                if (seen.Count == n) break;
            }
            return seen;
        });
        var completions = Task.Run(async () =>
        {
            var done = new List<Completion>();
            await foreach (var c in producer.ReadCompletionsAsync(cts.Token))
            {
                done.Add(c);
                if (done.Count == n) break;
            }
            return done;
        });
        for (ulong id = 0; id < n; id++)
        {
            using var lease = await producer.AcquireAsync(cts.Token);
            int length = Size - (int)id * 1000;
            FramePattern.Fill(id, lease.Span[..length]);
            lease.FrameId = id;
            lease.GroupId = FramePattern.WaferOf(id);
            lease.SetAttributes(FramePattern.Attributes(id));
            lease.Submit(length);
        }

        var frames = await received.WaitAsync(cts.Token);
        var done = await completions.WaitAsync(cts.Token);
        Assert.All(done, c => Assert.True(c.Delivered, c.ToString()));
        Assert.Equal(Enumerable.Range(0, n).Select(i => (ulong)i), done.Select(c => c.FrameId).Order());
        Assert.Equal(Enumerable.Range(0, n).Select(i => (ulong)i), frames.Select(f => f.Id));
        Assert.All(frames, f =>
        {
            Assert.Equal(Size - (int)f.Id * 1000, f.Length);
            Assert.Equal(FramePattern.WaferOf(f.Id), f.Wafer);
            Assert.Equal(FramePattern.Attributes(f.Id), f.Attrs);
            Assert.Equal(-1, f.Bad);
        });
    }
}
