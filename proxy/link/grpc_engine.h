// The engine gRPC runs its timers and callbacks on, in place of its own.
//
// gRPC 1.51 gives every process an EventEngine (for its idle timers and the
// callbacks they start).  Its own keeps three threads, and its timer thread
// wakes once a second whether or not a timer is due: on a line of 64 idle
// daemons that is 64 wakes a second for nothing.  This one has a thread that
// sleeps until the earliest timer (for good while there is none), and more
// only while the ones it has are all busy.
//
// gRPC 1.51 asks an engine for nothing else while its experiments are off:
// connections, listeners and names stay with its iomgr.  So the daemon puts
// this engine in only then (GRPC_EXPERIMENTS unset), and what it cannot do
// it refuses with a status that says so (and says once in the log).
#pragma once

#include <grpc/event_engine/event_engine.h>

#include <memory>

namespace framelink {

// An engine of its own (tests); gRPC gets its engines from the factory below.
std::unique_ptr<grpc_event_engine::experimental::EventEngine> makeQuietEventEngine();

// Whether GRPC_EXPERIMENTS names any: gRPC then keeps its own engine and its own timing.
bool grpcExperimentsSet();

// Makes every engine gRPC creates from now on one of ours, unless
// GRPC_EXPERIMENTS is set.  Before the first channel or server; true when
// it did.
bool installQuietEventEngine();

}  // namespace framelink
