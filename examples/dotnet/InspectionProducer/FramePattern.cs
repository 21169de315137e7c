using System.Buffers.Binary;
using System.Text;

namespace FrameLink.Examples;

/// <summary>
/// The deterministic payload of `framelink send/recv` (client/cli/frame_pattern.h): word i (8 bytes,
/// little-endian) = splitmix64(frameId * 0x9E3779B97F4A7C15 + i), the last partial word truncated;
/// groupId = frameId / 25; attributes "frame=&lt;id&gt;;wafer=&lt;wafer&gt;". A receiver checks every byte
/// knowing only the frame id.
/// </summary>
public static class FramePattern
{
    public const ulong Golden = 0x9E3779B97F4A7C15UL;
    public const ulong FramesPerWafer = 25;

    public static ulong WaferOf(ulong frameId) => frameId / FramesPerWafer;

    public static string Attributes(ulong frameId) => $"frame={frameId};wafer={WaferOf(frameId)}";

    public static ulong SplitMix64(ulong x)
    {
        ulong z = x + Golden;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9UL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBUL;
        return z ^ (z >> 31);
    }

    public static void Fill(ulong frameId, Span<byte> dst)
    {
        ulong b = frameId * Golden;
        int words = dst.Length / 8;
        for (int i = 0; i < words; i++)
            BinaryPrimitives.WriteUInt64LittleEndian(dst.Slice(i * 8, 8), SplitMix64(b + (ulong)i));
        int tail = dst.Length - words * 8;
        if (tail > 0)
        {
            Span<byte> last = stackalloc byte[8];
            BinaryPrimitives.WriteUInt64LittleEndian(last, SplitMix64(b + (ulong)words));
            last[..tail].CopyTo(dst[(words * 8)..]);
        }
    }

    /// <summary>Index of the first byte that differs from the pattern of frameId, or -1.</summary>
    public static int Mismatch(ulong frameId, ReadOnlySpan<byte> data)
    {
        var want = new byte[data.Length];
        Fill(frameId, want);
        int common = data.CommonPrefixLength(want);
        return common == data.Length ? -1 : common;
    }

    public static byte[] AttributesBytes(ulong frameId) => Encoding.ASCII.GetBytes(Attributes(frameId));
}
