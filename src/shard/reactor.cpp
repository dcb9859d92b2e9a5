#include "sluice/shard/reactor.hpp"

#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "sluice/core/clock.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"

namespace sluice::shard {

namespace {
// IORING_FEAT_MIN_TIMEOUT (Linux 6.12), newer than Debian 12's headers.
constexpr uint32_t k_feat_min_timeout = 1u << 15;
}  // namespace

std::unique_ptr<reactor> reactor::create(const options& o) {
  std::unique_ptr<reactor> r(new reactor());
  r->_tick_ms = o.tick_ms;
  r->_poll = poll_window(uint64_t{o.idle_poll_us} * 1000);
  io_uring_params p{};
  int rc = -EINVAL;
  // Preferred: one issuer thread, task work run only when we wait
  // (IORING_SETUP_SINGLE_ISSUER: Linux 6.0, IORING_SETUP_DEFER_TASKRUN: 6.1).
  // COOP_TASKRUN (5.19) avoids IPIs when DEFER_TASKRUN is not available.
  // TASKRUN_FLAG (5.19, as COOP_TASKRUN) marks pending task work in the SQ
  // ring, so a polling loop sees it without a system call.
  struct attempt {
    unsigned flags;
    const char* name;
  };
  const attempt attempts[] = {
      {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
       "single_issuer+defer_taskrun"},
      {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
       "single_issuer+coop_taskrun"},
      {IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG, "coop_taskrun"},
      {IORING_SETUP_COOP_TASKRUN, "coop_taskrun, no taskrun flag"},
      {0, "plain"},
  };
  for (const attempt& a : attempts) {
    if ((a.flags & IORING_SETUP_SINGLE_ISSUER) && !o.single_issuer) continue;
    if ((a.flags & IORING_SETUP_DEFER_TASKRUN) && !o.defer_taskrun) continue;
    p = io_uring_params{};
    p.flags = a.flags | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_CQSIZE;
    p.cq_entries = o.entries * 4;
    rc = io_uring_queue_init_params(o.entries, &r->_ring, &p);
    if (rc == -EINVAL) {  // SUBMIT_ALL (5.18) missing: try without it
      p = io_uring_params{};
      p.flags = a.flags | IORING_SETUP_CQSIZE;
      p.cq_entries = o.entries * 4;
      rc = io_uring_queue_init_params(o.entries, &r->_ring, &p);
    }
    if (rc == 0) {
      r->_setup_mode = a.name;
      r->_taskrun_flag = (a.flags & IORING_SETUP_TASKRUN_FLAG) != 0;
      break;
    }
    if (rc != -EINVAL) break;  // a real failure, not a missing flag
  }
  if (rc != 0) {
    const char* cause = rc == -ENOMEM   ? "the locked-memory limit (ulimit -l) is too low for the ring"
                        : rc == -EPERM  ? "io_uring is disabled (sysctl kernel.io_uring_disabled) or blocked by seccomp"
                        : rc == -ENOSYS ? "this kernel has no io_uring"
                                        : "unexpected error";
    log::error("io_uring_queue_init failed: {} ({})", std::strerror(-rc), cause);
    return nullptr;
  }
  r->_ring_ready = true;
  // The ring's fd registered with this thread (Linux 5.18): every
  // io_uring_enter then skips the fd-table lookup and reference count of the
  // ring's file. Optional: without it the ring works the same.
  r->_ring_fd_registered = io_uring_register_ring_fd(&r->_ring) == 1;
  if ((p.features & IORING_FEAT_EXT_ARG) == 0) {
    log::error("io_uring lacks IORING_FEAT_EXT_ARG (Linux 5.11): kernel too old");
    return nullptr;
  }
  // The batched wait's minimum time rides in io_uring_getevents_arg's old
  // pad field, which a kernel without the feature requires to be 0.
  if ((p.features & k_feat_min_timeout) != 0) r->_batch_wait_us = o.batch_wait_us;
  // The registered-file table, empty (optional: without it every operation
  // takes the plain fd). It may not be larger than RLIMIT_NOFILE.
  unsigned slots = o.file_slots;
  if (utsname u{}; slots != 0 && (::uname(&u) != 0 || !file_table_frees_promptly(u.release))) slots = 0;
  if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < slots) slots = static_cast<unsigned>(rl.rlim_cur);
  if (slots != 0 && io_uring_register_files_sparse(&r->_ring, slots) == 0) {
    r->_file_slots = slots;
    r->_file_fds = std::make_unique<int[]>(slots);
    r->_file_next_free = std::make_unique<int32_t[]>(slots);
    for (unsigned i = 0; i < slots; ++i) {
      r->_file_fds[i] = -1;
      r->_file_next_free[i] = i + 1 < slots ? static_cast<int32_t>(i + 1) : file_slot::none;
    }
    r->_file_free = 0;
    r->_files_failed.fn = &reactor::on_files_update;
  }
  r->_event_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (r->_event_fd < 0) {
    log::error("eventfd failed: {}", std::strerror(errno));
    return nullptr;
  }
  r->_wake_completion.fn = &reactor::on_wake;
  r->_wake_completion.owner = r.get();
  r->arm_wake();
  r->_now_ms = monotonic_ms();
  r->sync_wall(r->_now_ms);
  return r;
}

void reactor::sync_wall(uint64_t now_ms) noexcept {
  _wall_offset_ms = static_cast<int64_t>(realtime_ms()) - static_cast<int64_t>(now_ms);
  _wall_synced_ms = now_ms;
}

reactor::~reactor() {
  if (_ring_ready) io_uring_queue_exit(&_ring);
  if (_event_fd >= 0) ::close(_event_fd);
}

io_uring_sqe* reactor::sqe(completion* c) noexcept {
  io_uring_sqe* s = io_uring_get_sqe(&_ring);
  while (s == nullptr) {
    io_uring_submit(&_ring);
    s = io_uring_get_sqe(&_ring);
  }
  io_uring_sqe_set_data(s, c);
  return s;
}

io_uring_sqe* reactor::sqe_untracked() noexcept { return sqe(nullptr); }

bool file_table_frees_promptly(std::string_view release) noexcept {
  // "MAJOR.MINOR[.PATCH][-extra]"; anything else: no.
  unsigned part[2] = {0, 0};
  size_t i = 0;
  for (unsigned& v : part) {
    const size_t start = i;
    while (i < release.size() && release[i] >= '0' && release[i] <= '9' && i - start < 4) {
      v = v * 10 + static_cast<unsigned>(release[i] - '0');
      ++i;
    }
    if (i == start) return false;
    if (&v == &part[0]) {
      if (i >= release.size() || release[i] != '.') return false;
      ++i;
    }
  }
  return part[0] > 6 || (part[0] == 6 && part[1] >= 13);
}

file_slot reactor::register_file(int fd) noexcept {
  SLUICE_ASSERT(fd >= 0);
  if (_file_free == file_slot::none) return file_slot{};
  const int32_t i = _file_free;
  _file_free = _file_next_free[i];
  _file_next_free[i] = file_slot::none;
  _file_fds[i] = fd;
  ++_file_count;
  queue_files_update(i, &_file_fds[i]);
  return file_slot{i};
}

void reactor::unregister_file(file_slot& slot) noexcept {
  if (!slot.valid()) return;
  const int32_t i = slot.index;
  SLUICE_ASSERT(static_cast<unsigned>(i) < _file_slots && _file_fds[i] >= 0);
  static constexpr int k_empty = -1;
  queue_files_update(i, &k_empty);
  _file_fds[i] = -1;
  _file_next_free[i] = _file_free;
  _file_free = i;
  --_file_count;
  slot = file_slot{};
}

void reactor::queue_files_update(int32_t slot, const int* fd) noexcept {
  // The kernel reads *fd when this SQE is submitted, before any SQE queued
  // after it: an operation aimed at the slot finds the file there. A slot
  // given back and taken again before the submission is updated twice, in
  // order; the last update wins. On success there is no CQE.
  io_uring_sqe* s = sqe(&_files_failed);
  io_uring_prep_files_update(s, const_cast<int*>(fd), 1, slot);
  s->flags |= IOSQE_CQE_SKIP_SUCCESS;
}

void reactor::on_files_update(completion*, const io_uring_cqe* cqe) {
  // The file was not installed: operations aimed at the slot fail (EBADF)
  // and their connection closes as on any socket error.
  log::warn("io_uring: registering a file failed: {}", std::strerror(-cqe->res));
}

void reactor::arm_wake() noexcept {
  io_uring_sqe* s = sqe(&_wake_completion);
  io_uring_prep_read(s, _event_fd, &_event_value, sizeof _event_value, 0);
}

void reactor::on_wake(completion* c, const io_uring_cqe*) {
  static_cast<wake_completion*>(c)->owner->arm_wake();
}

void reactor::wake() noexcept {
  uint64_t one = 1;
  ssize_t n = ::write(_event_fd, &one, sizeof one);
  (void)n;  // EAGAIN: the counter is saturated, the loop is awake anyway
}

namespace {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

bool reactor::poll_for_completion(uint64_t window_ns, uint64_t& now_ns) noexcept {
  const uint64_t until = now_ns + window_ns;
  // Runs the task work the kernel flagged (a socket became readable, say):
  // its CQEs land in the ring. Returns: false when that failed (the poll
  // then ends: the wait that follows runs it).
  const auto run_task_work = [this]() noexcept {
    if (!_taskrun_flag || (IO_URING_READ_ONCE(*_ring.sq.kflags) & IORING_SQ_TASKRUN) == 0) return true;
    return io_uring_get_events(&_ring) >= 0;
  };
  for (unsigned i = 1;; ++i) {
    if (io_uring_cq_ready(&_ring) != 0) return true;
    if (!run_task_work()) return false;
    if (io_uring_cq_ready(&_ring) != 0) return true;
    cpu_relax();
    if ((i & 7) == 0) {
      now_ns = monotonic_ns();
      if (now_ns >= until) {
        // Last look, task work included: the thread may have been off its
        // core for part of the window.
        return run_task_work() && io_uring_cq_ready(&_ring) != 0;
      }
    }
  }
}

unsigned reactor::run_once(uint32_t wait_ms) noexcept {
  // Polling: submit first (a send completes inline and posts its CQE now),
  // then poll for the window, then sleep. How long a wait the poll did not
  // catch took teaches the window (poll_window); a caught one leaves it. A
  // call that does not wait (wait_ms 0) does not poll either.
  const bool poll = _poll_allowed && _poll.max_ns() != 0 && wait_ms != 0;
  bool ready = false;
  uint64_t wait_start_ns = 0;
  if (poll) {
    io_uring_submit(&_ring);
    ready = io_uring_cq_ready(&_ring) != 0;
    if (!ready) {
      wait_start_ns = monotonic_ns();
      if (_poll.ns() != 0) {
        uint64_t t = wait_start_ns;
        ready = poll_for_completion(_poll.ns(), t);
        if (ready) {
          ++_poll_stats.caught;
          t = monotonic_ns();
        } else {
          ++_poll_stats.missed;
        }
        _poll_stats.ns += t - wait_start_ns;
      }
    }
  }
  __kernel_timespec ts{};
  ts.tv_sec = wait_ms / 1000;
  ts.tv_nsec = static_cast<long long>(wait_ms % 1000) * 1'000'000;
  io_uring_cqe* cqe = nullptr;
  int rc;
  if (_batch > 1 && _batch_wait_us != 0 && !poll && io_uring_cq_ready(&_ring) == 0) {
    rc = submit_and_wait_batch(_batch, ts);
    ++_batched_waits;
  } else {
    rc = io_uring_submit_and_wait_timeout(&_ring, &cqe, 1, &ts, nullptr);
  }
  if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EBUSY) {
    log::error("io_uring_submit_and_wait_timeout: {}", std::strerror(-rc));
  }
  const uint64_t now_ns = monotonic_ns();
  _now_ms = now_ns / 1'000'000u;
  if (_now_ms - _wall_synced_ms >= 1000) sync_wall(_now_ms);
  if (poll && wait_start_ns != 0 && !ready) _poll.on_wait(now_ns - wait_start_ns);
  // The batch is what is posted now; the hook runs before any of it.
  const unsigned batch = io_uring_cq_ready(&_ring);
  if (_hooks != nullptr && _hooks->before_completions != nullptr) _hooks->before_completions(_hooks->ctx, _now_ms);
  unsigned head;
  unsigned seen = 0;
  io_uring_for_each_cqe(&_ring, head, cqe) {
    if (seen == batch) break;
    ++seen;
    auto* c = static_cast<completion*>(io_uring_cqe_get_data(cqe));
    if (c != nullptr) c->fn(c, cqe);
  }
  io_uring_cq_advance(&_ring, seen);
  _cqes += seen;
  ++_iterations;
  return seen;
}

int reactor::submit_and_wait_batch(unsigned nr, const __kernel_timespec& ts) noexcept {
  // What io_uring_submit does before it enters: publish the SQEs queued
  // since the last submit by moving the kernel's tail to ours (a release
  // store: the SQEs' contents before it; no SQPOLL thread reads the tail
  // meanwhile, the system call below does).
  io_uring_sq& sq = _ring.sq;
  if (sq.sqe_head != sq.sqe_tail) {
    sq.sqe_head = sq.sqe_tail;
    __atomic_store_n(sq.ktail, sq.sqe_tail, __ATOMIC_RELEASE);
  }
  const unsigned to_submit = sq.sqe_tail - __atomic_load_n(sq.khead, __ATOMIC_ACQUIRE);
  // { sigmask, sigmask_sz, min_wait_usec (Linux 6.12; "pad" in older
  // headers, hence the order, not the name), ts }.
  const io_uring_getevents_arg arg{0, 0, _batch_wait_us, reinterpret_cast<uint64_t>(&ts)};
  unsigned flags = IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG;
  // With the ring's fd registered, enter_ring_fd is its index in this
  // thread's table, as liburing's own calls use it.
  if (_ring_fd_registered) flags |= IORING_ENTER_REGISTERED_RING;
  return io_uring_enter2(static_cast<unsigned>(_ring.enter_ring_fd), to_submit, nr, flags,
                         reinterpret_cast<sigset_t*>(const_cast<io_uring_getevents_arg*>(&arg)), sizeof arg);
}

void reactor::run(const hooks& h) noexcept {
  _hooks = &h;
  while (!_stopping) {
    run_once(_tick_ms);
    if (h.on_iteration != nullptr) h.on_iteration(h.ctx, _now_ms);
  }
  _hooks = nullptr;
  io_uring_submit(&_ring);
}

}  // namespace sluice::shard
