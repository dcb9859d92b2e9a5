#pragma once
// shard: the per-core event loop. One io_uring per shard thread (or the
// control thread), created and driven only by that thread.
//
// Every SQE carries a `completion*` as user_data; the object that owns the
// operation embeds the completion and stays alive until its CQE arrives
// (multishot operations: until a CQE without IORING_CQE_F_MORE).
#include <liburing.h>

#include <cstdint>
#include <memory>
#include <string_view>

#include "sluice/core/result.hpp"
#include "sluice/shard/poll_window.hpp"

namespace sluice::shard {

struct completion {
  void (*fn)(completion* self, const io_uring_cqe* cqe) = nullptr;
};

// A slot of a reactor's registered-file table, or none. Whoever holds one
// aims its socket's operations at it (aim) and gives it back before closing
// the plain fd.
struct file_slot {
  static constexpr int32_t none = -1;
  int32_t index = none;
  bool valid() const noexcept { return index != none; }
};

// Whether a kernel of this release (uname -r) drops a file given back to
// the registered-file table when that slot's own operations are done
// (Linux 6.13). Before, a removal waited for every operation issued on
// the table before it, so one long-lived receive (a keep-alive client's
// multishot) kept every socket closed after it open: the table is made
// only where that cannot happen.
bool file_table_frees_promptly(std::string_view release) noexcept;

// Points a prepared SQE at the registered file in `slot` instead of the
// plain fd it was prepared with (no slot: leaves the fd).
inline void aim(io_uring_sqe* s, file_slot slot) noexcept {
  if (!slot.valid()) return;
  s->fd = slot.index;
  s->flags |= IOSQE_FIXED_FILE;
}

// Shard-local. Lives as long as its thread's loop.
class reactor {
 public:
  struct options {
    unsigned entries = 4096;
    bool single_issuer = true;   // IORING_SETUP_SINGLE_ISSUER: Linux 6.0
    bool defer_taskrun = true;   // IORING_SETUP_DEFER_TASKRUN: Linux 6.1
    uint32_t tick_ms = 20;       // the loop wakes at least this often for timers
    // The most the loop polls for a completion before it sleeps, while its
    // owner allows it (allow_poll): see poll_window. 0: never poll.
    uint32_t idle_poll_us = 0;
    // Slots of the registered-file table (see register_file). 0: none.
    unsigned file_slots = 0;
    // Batched waits (see batch): while the owner asks for more than one
    // completion, a wait ends when that many have come or, once this long
    // has passed, when at least one has (IORING_FEAT_MIN_TIMEOUT, Linux
    // 6.12). 0: never batch; every wait ends at the first completion.
    uint32_t batch_wait_us = 0;
  };

  struct poll_stats {
    uint64_t caught = 0;   // polls that found a completion
    uint64_t missed = 0;   // polls that saw their window pass
    uint64_t ns = 0;       // time spent polling
  };

  struct hooks {
    // Called once per loop iteration, after the wait and before the
    // iteration's CQEs, which are exactly those posted before the call (one
    // posted during it waits for the next iteration). So what it takes in
    // -- a peer's message pushed before the event that a CQE of this batch
    // completes -- is there when that CQE's handler runs.
    void (*before_completions)(void* ctx, uint64_t now_ms) = nullptr;
    // Called once per loop iteration, after the CQEs of that iteration, with
    // the iteration's clock reading.
    void (*on_iteration)(void* ctx, uint64_t now_ms) = nullptr;
    void* ctx = nullptr;
  };

  // Creates the ring, trying SINGLE_ISSUER | DEFER_TASKRUN first and falling
  // back to plain flags on kernels without them. Returns: the reactor, or
  // errc::internal with a log line naming the likely cause (ENOMEM: memlock
  // limit; ENOSYS/EPERM: io_uring disabled by kernel.io_uring_disabled or a
  // seccomp filter).
  static std::unique_ptr<reactor> create(const options& o);
  ~reactor();
  reactor(const reactor&) = delete;
  reactor& operator=(const reactor&) = delete;

  io_uring* ring() noexcept { return &_ring; }
  const char* setup_mode() const noexcept { return _setup_mode; }

  // Returns a zeroed SQE with user_data = c. Submits pending SQEs first when
  // the submission queue is full (never fails after that).
  io_uring_sqe* sqe(completion* c) noexcept;
  // An SQE whose CQE nobody waits for (user_data 0).
  io_uring_sqe* sqe_untracked() noexcept;

  // Runs until stop() or a hook asks. Returns after draining the iteration.
  void run(const hooks& h) noexcept;
  // One iteration: submit, wait up to `wait_ms` for a completion, dispatch
  // what is there (a poll first makes the wait up to the poll window
  // longer). Returns: the number of completions handled. While polling
  // is allowed, the submit goes first and the wait is preceded by a poll of
  // the window's length (with IORING_SETUP_TASKRUN_FLAG the poll also runs
  // the task work the kernel flags, so it needs no system call to see it).
  unsigned run_once(uint32_t wait_ms) noexcept;
  // The owner's say, per iteration: whether polling pays now (a shard allows
  // it while few requests are open: under load completions come back to back
  // and a poll would only fill the gaps between them).
  void allow_poll(bool yes) noexcept { _poll_allowed = yes; }
  const poll_stats& polls() const noexcept { return _poll_stats; }
  // The owner's say, per iteration: how many completions the next wait may
  // hold out for, up to options::batch_wait_us (a shard asks for several
  // while many requests are open: each wake-up then serves a batch, at the
  // cost of up to that long for a completion that comes alone). 0 or 1: the
  // first completion ends the wait. Ignored while a poll runs, where the
  // kernel has no batched wait (batch_waits() false), and when completions
  // are already there.
  void batch(unsigned completions) noexcept { _batch = completions; }
  bool batch_waits() const noexcept { return _batch_wait_us != 0; }
  // Waits that asked the kernel for a batch (those that found completions
  // already there are not counted).
  uint64_t batched_waits() const noexcept { return _batched_waits; }
  uint64_t poll_window_ns() const noexcept { return _poll.ns(); }
  void stop() noexcept { _stopping = true; }
  bool stopping() const noexcept { return _stopping; }

  // Registered files (a sparse table; made on Linux 6.13 and later, see
  // file_table_frees_promptly): an operation on a slot
  // (IOSQE_FIXED_FILE) skips the fd-table lookup and the file's reference
  // count that every operation on a plain fd pays when it is issued. A slot
  // holds a reference to the file of its own: the owner keeps its plain fd
  // for everything else (setsockopt, shutdown, TLS) and gives the slot back
  // before it closes that fd, so the close is the last reference.
  //
  // The table is updated by an SQE (IORING_OP_FILES_UPDATE, no CQE unless it
  // fails) issued in order with the operations after it: no system call.
  // Returns: the slot, or file_slot::none when there is no table (none
  // asked for, an older kernel) or it is full; the fd then serves as before.
  file_slot register_file(int fd) noexcept;
  // Gives `slot` back (none: nothing to do). Its operations must all have
  // completed: the owner's op count says so.
  void unregister_file(file_slot& slot) noexcept;
  unsigned files_registered() const noexcept { return _file_count; }
  unsigned file_slots() const noexcept { return _file_slots; }

  // Any thread: wakes the loop (eventfd write). Cheap enough per message batch.
  void wake() noexcept;

  uint64_t now_ms() const noexcept { return _now_ms; }
  // The wall clock (Unix ms) of the same instant as now_ms(): the monotonic
  // clock plus an offset read again once a second, so a request costs no
  // clock read of its own (a step of the system clock shows within 1 s).
  uint64_t wall_ms() const noexcept { return _now_ms + static_cast<uint64_t>(_wall_offset_ms); }
  uint64_t iterations() const noexcept { return _iterations; }
  uint64_t cqes() const noexcept { return _cqes; }

 private:
  reactor() = default;
  static void on_wake(completion* c, const io_uring_cqe* cqe);
  void arm_wake() noexcept;
  // Spins until a completion is ready or `window_ns` passed. Returns: whether
  // one is ready; `now_ns` is the clock at the end.
  bool poll_for_completion(uint64_t window_ns, uint64_t& now_ns) noexcept;
  // Submits what is queued and waits for `nr` completions, or for at least
  // one once _batch_wait_us has passed, or until `ts`. Returns: as
  // io_uring_enter.
  int submit_and_wait_batch(unsigned nr, const __kernel_timespec& ts) noexcept;

  // Reads the wall clock's offset from the monotonic one again (wall_ms).
  void sync_wall(uint64_t now_ms) noexcept;
  static void on_files_update(completion* c, const io_uring_cqe* cqe);
  void queue_files_update(int32_t slot, const int* fd) noexcept;

  io_uring _ring{};
  // Registered-file table: the fd each slot was given (the update SQE reads
  // it when it is submitted, so it lives here, not on a caller's stack) and
  // a free list through the slots not in use.
  std::unique_ptr<int[]> _file_fds;
  std::unique_ptr<int32_t[]> _file_next_free;
  unsigned _file_slots = 0;
  unsigned _file_count = 0;
  int32_t _file_free = -1;
  completion _files_failed{};
  int _event_fd = -1;
  uint64_t _event_value = 0;
  struct wake_completion : completion {
    reactor* owner = nullptr;
  };
  wake_completion _wake_completion{};
  const char* _setup_mode = "";
  uint32_t _tick_ms = 20;
  uint64_t _now_ms = 0;
  int64_t _wall_offset_ms = 0;  // realtime - monotonic, in ms
  uint64_t _wall_synced_ms = 0;  // now_ms when it was read
  uint64_t _iterations = 0;
  uint64_t _cqes = 0;
  bool _stopping = false;
  bool _ring_ready = false;
  bool _taskrun_flag = false;  // the kernel flags pending task work in the SQ ring
  bool _poll_allowed = false;
  bool _ring_fd_registered = false;  // io_uring_register_ring_fd took it
  uint32_t _batch_wait_us = 0;  // 0: the kernel has no batched wait, or none was asked for
  unsigned _batch = 0;
  uint64_t _batched_waits = 0;
  const hooks* _hooks = nullptr;  // run()'s, while it runs
  poll_window _poll;
  poll_stats _poll_stats;
};

}  // namespace sluice::shard
