#pragma once
// shard: bounded single-producer/single-consumer queue between two threads
// (shard <-> shard, control <-> shard). Lock-free; push and pop are wait-free.
// T must be trivially copyable: messages are small values, never pointers to
// memory the receiver would free (nothing allocated on shard A is freed on B).
//
// Layout: the producer's index and the consumer's index sit on separate
// cache lines, each with a cached copy of the other side's index, so that in
// the steady state neither side touches the other's line (Seastar's
// smp_message_queue does the same for the same reason: false sharing costs
// a cache-line transfer per message).
//
// IMPLEMENTATION: to be written (see tests/unit/shard/spsc_queue_test.cpp).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace sluice::shard {

template <class T, size_t Capacity>
class spsc_queue;

}  // namespace sluice::shard
