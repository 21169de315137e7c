using System.Runtime.CompilerServices;

[assembly: InternalsVisibleTo("FrameLink.Tests")]
