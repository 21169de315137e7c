using System.Diagnostics;
using System.Security.Cryptography;

namespace FrameLink.Tests;

internal static class Repo
{
    public static readonly string Root = FindRoot();
    public static readonly string BuildDir =
        Environment.GetEnvironmentVariable("FRAMELINK_BUILD_DIR") is { Length: > 0 } b ? b : Path.Combine(Root, "build");
    public static string Daemon =>
        Environment.GetEnvironmentVariable("FRAMELINKD") is { Length: > 0 } d ? d : Path.Combine(BuildDir, "proxy", "framelinkd");

    private static string FindRoot()
    {
        for (var dir = new DirectoryInfo(AppContext.BaseDirectory); dir != null; dir = dir.Parent)
            if (File.Exists(Path.Combine(dir.FullName, "include", "framelink", "framelink.h"))) return dir.FullName;
        throw new InvalidOperationException("cannot find the framelink source tree above " + AppContext.BaseDirectory);
    }
}

/// <summary>One real framelinkd with its own socket, ready file and log in a temp dir.</summary>
internal sealed class Daemon : IDisposable
{
    private readonly Process process;
    public string Name { get; }
    public string Socket { get; }
    public string LogFile { get; }
    public int GrpcPort { get; }

    public Daemon(string dir, string name, IEnumerable<string> args)
    {
        Name = name;
        Socket = Path.Combine(dir, name + ".sock");
        LogFile = Path.Combine(dir, name + ".log");
        string ready = Path.Combine(dir, name + ".ready");
        File.Delete(ready); // from an earlier run under this name (a restart)
        if (!File.Exists(Repo.Daemon))
            throw new InvalidOperationException($"framelinkd not found at {Repo.Daemon}: build it (scripts/build.sh) or set FRAMELINKD");
        var psi = new ProcessStartInfo("/bin/sh") { UseShellExecute = false, RedirectStandardInput = true };
        // sh redirects the daemon's output into its log file (no pipes to drain).
        var argv = new List<string> { Repo.Daemon, "--id", name, "--socket", Socket, "--listen", "127.0.0.1:0",
            "--data-listen", "127.0.0.1:0", "--ready-file", ready };
        argv.AddRange(args);
        psi.ArgumentList.Add("-c");
        psi.ArgumentList.Add("exec \"$@\" >\"$0\" 2>&1 </dev/null");
        psi.ArgumentList.Add(LogFile);
        foreach (var a in argv) psi.ArgumentList.Add(a);
        process = Process.Start(psi)!;
        var deadline = DateTime.UtcNow.AddSeconds(15);
        while (DateTime.UtcNow < deadline)
        {
            if (process.HasExited) throw new InvalidOperationException($"framelinkd {name} exited ({process.ExitCode}) before it was ready:\n{Log()}");
            if (File.Exists(ready))
            {
                var kv = File.ReadAllLines(ready).Select(l => l.Split('=', 2)).Where(p => p.Length == 2).ToDictionary(p => p[0], p => p[1]);
                if (kv.TryGetValue("grpc_port", out var port) && port.Length > 0)
                {
                    GrpcPort = int.Parse(port);
                    return;
                }
            }
            Thread.Sleep(10);
        }
        Stop();
        throw new InvalidOperationException($"framelinkd {name} did not get ready within 15 s:\n{Log()}");
    }

    /// <summary>kill -9, as a crash.</summary>
    public void Kill()
    {
        if (!process.HasExited) process.Kill();
        process.WaitForExit();
    }

    public string Log() => File.Exists(LogFile) ? File.ReadAllText(LogFile) : "";

    public int Stop()
    {
        if (!process.HasExited)
        {
            Process.Start("kill", ["-TERM", process.Id.ToString()])!.WaitForExit();
            if (!process.WaitForExit(10000)) process.Kill();
        }
        process.WaitForExit();
        return process.ExitCode;
    }

    public void Dispose() => Stop();
}

/// <summary>Daemon B, then daemon A dialing B over tcp on loopback: A's producers reach B's consumers.
/// Stream <see cref="DropStream"/> is in both daemons' drop_streams, with drop_lag 1.</summary>
public sealed class DaemonPair : IDisposable
{
    private readonly string dir;
    private readonly string[] argsA;
    internal Daemon A { get; private set; }
    internal Daemon B { get; }

    internal const string DropStream = "cs-drop";

    public DaemonPair()
    {
        dir = Directory.CreateTempSubdirectory("fl-cs.").FullName;
        string token = Convert.ToHexString(RandomNumberGenerator.GetBytes(16));
        string[] common = ["--transports", "tcp", "--token", token, "--log-level", "warn",
                           "--drop-stream", DropStream, "--drop-lag", "1"];
        B = new Daemon(dir, "b", common);
        argsA = [.. common, "--peer", $"b=127.0.0.1:{B.GrpcPort}"];
        A = new Daemon(dir, "a", argsA);
    }

    /// <summary>Starts A again (after <see cref="Daemon.Kill"/>) on the same socket, with more arguments if given.</summary>
    internal void RestartA(params string[] extra) => A = new Daemon(dir, "a", [.. argsA, .. extra]);

    public string SocketA => A.Socket;
    public string SocketB => B.Socket;

    public void Dispose()
    {
        int a = A.Stop(), b = B.Stop();
        Directory.Delete(dir, recursive: true);
        if (a != 0 || b != 0) throw new InvalidOperationException($"daemons must exit 0 on SIGTERM; got a={a} b={b}");
    }
}

[CollectionDefinition("daemons")]
public sealed class DaemonCollection : ICollectionFixture<DaemonPair> { }
