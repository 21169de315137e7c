// gRPC's timer thread, asleep until its next timer is due.
//
// gRPC 1.51 keeps its own timers (deadlines, keep-alives, back-off) in a
// list of shards, two per core, that a thread of its own (grpc_global_timer)
// looks at.  Each shard looks at most a second ahead, so the thread wakes at
// least once a second per process, and up to once per shard when their
// seconds drift apart, whether or not a timer is due: on a line of 64 idle
// daemons, 64 to 256 wakes a second for nothing.
//
// This keeps gRPC's timer list and its thread as they are, and tells the
// thread, each time it asks when to look again, the deadline of the earliest
// timer armed (for good while there is none).  A timer armed for before that
// wakes the thread the way gRPC itself does (its kick).
//
// The interface it goes through is gRPC's iomgr timer table: exported by
// libgrpc, but its header is not installed.  So it is taken only from gRPC
// 1.51, whose layout is the one written here; from any other gRPC, or with
// GRPC_EXPERIMENTS set, gRPC keeps its own timing and the reason is returned.
#pragma once

#include <string>

namespace framelink {

// Before anything of gRPC starts (the first channel, server or grpc_init).
// Empty when installed, else why not (for the log).
std::string installQuietGrpcTimers();

}  // namespace framelink
