#include <string_view>
#include <doctest/doctest.h>

#include <atomic>
#include <memory>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include <sys/socket.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "sluice/core/clock.hpp"
#include "sluice/shard/reactor.hpp"

using sluice::shard::completion;
using sluice::shard::file_slot;
using sluice::shard::reactor;

namespace {
// Counts its completions and keeps the last result.
struct nop_probe : completion {
  int calls = 0;
  int res = -1;
  nop_probe() {
    fn = [](completion* c, const io_uring_cqe* cqe) {
      auto* self = static_cast<nop_probe*>(c);
      ++self->calls;
      self->res = cqe->res;
    };
  }
};

// A reactor allowed to poll for up to `poll_us` before it sleeps.
std::unique_ptr<reactor> polling_reactor(uint32_t poll_us, uint32_t tick_ms = 20) {
  reactor::options o;
  o.idle_poll_us = poll_us;
  o.tick_ms = tick_ms;
  auto r = reactor::create(o);
  if (r) r->allow_poll(true);
  return r;
}
}  // namespace

// A connected pair of stream sockets, closed at the end unless taken.
struct socket_pair {
  int fd[2] = {-1, -1};
  socket_pair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd) == 0); }
  ~socket_pair() {
    for (int f : fd) {
      if (f >= 0) ::close(f);
    }
  }
};

// Whether this machine's kernel gets a registered-file table.
bool kernel_has_file_table() {
  utsname u{};
  REQUIRE(::uname(&u) == 0);
  return sluice::shard::file_table_frees_promptly(u.release);
}

// A reactor asking for `slots` registered-file slots.
std::unique_ptr<reactor> reactor_with_files(unsigned slots) {
  reactor::options o;
  o.file_slots = slots;
  auto r = reactor::create(o);
  REQUIRE(r != nullptr);
  return r;
}

// Whether this machine's kernel has batched waits (IORING_FEAT_MIN_TIMEOUT,
// Linux 6.12): read from the release, apart from the ring's feature bits
// the reactor reads, so a kernel that has them and a reactor that misses
// them is a failure, not a silent fallback.
bool kernel_has_batched_waits() {
  utsname u{};
  REQUIRE(::uname(&u) == 0);
  unsigned major = 0, minor = 0;
  REQUIRE(std::sscanf(u.release, "%u.%u", &major, &minor) == 2);
  return major > 6 || (major == 6 && minor >= 12);
}

// A reactor whose waits may hold out `batch_us` for a batch.
std::unique_ptr<reactor> batching_reactor(uint32_t batch_us) {
  reactor::options o;
  o.batch_wait_us = batch_us;
  o.tick_ms = 60000;
  auto r = reactor::create(o);
  REQUIRE(r != nullptr);
  CHECK(r->batch_waits() == (batch_us != 0 && kernel_has_batched_waits()));
  return r;
}

// A receive of one byte on `fd`: its completion comes when a byte does.
// (Not a timeout: the kernel ends any wait when one of those fires.)
struct byte_recv : nop_probe {
  char byte = 0;
  void queue(reactor& r, int fd) { io_uring_prep_recv(r.sqe(this), fd, &byte, 1, 0); }
};

// Writes one byte to each fd at its delay from the start, on a thread of
// its own; joined at the end.
class delayed_writes {
 public:
  explicit delayed_writes(std::vector<std::pair<int, int>> fd_at_ms) : _plan(std::move(fd_at_ms)) {
    _t = std::thread([this] {
      const auto start = std::chrono::steady_clock::now();
      for (const auto& [fd, ms] : _plan) {
        std::this_thread::sleep_until(start + std::chrono::milliseconds(ms));
        REQUIRE(::write(fd, "x", 1) == 1);
      }
    });
  }
  ~delayed_writes() { _t.join(); }

 private:
  std::vector<std::pair<int, int>> _plan;
  std::thread _t;
};

uint64_t elapsed_ms(uint64_t since_ns) { return (sluice::monotonic_ns() - since_ns) / 1'000'000u; }

// Sends `text` on `fd` aimed at `slot` (none: the plain fd) and runs the
// loop until the send completes. Returns: its result.
int send_via(reactor& r, int fd, file_slot slot, std::string_view text) {
  nop_probe p;
  io_uring_sqe* s = r.sqe(&p);
  io_uring_prep_send(s, fd, text.data(), text.size(), MSG_NOSIGNAL);
  sluice::shard::aim(s, slot);
  for (int i = 0; i < 50 && p.calls == 0; ++i) r.run_once(100);
  REQUIRE(p.calls == 1);
  return p.res;
}

TEST_SUITE("shard::reactor") {
  TEST_CASE("registered files: made only on kernels that free a given-back file with its own operations (6.13)") {
    using sluice::shard::file_table_frees_promptly;
    CHECK_FALSE(file_table_frees_promptly("6.1.0-18-amd64"));  // Debian 12
    CHECK_FALSE(file_table_frees_promptly("6.12.9"));
    CHECK_FALSE(file_table_frees_promptly("5.19.0"));
    CHECK(file_table_frees_promptly("6.13"));
    CHECK(file_table_frees_promptly("6.18.44-fc-v1272"));
    CHECK(file_table_frees_promptly("7.0.0-rc1"));
    CHECK(file_table_frees_promptly("10.2.1"));
    CHECK_FALSE(file_table_frees_promptly(""));
    CHECK_FALSE(file_table_frees_promptly("6"));
    CHECK_FALSE(file_table_frees_promptly("v6.13"));
    CHECK_FALSE(file_table_frees_promptly(".13"));
    // This machine: a table exactly where its kernel qualifies.
    auto r = reactor_with_files(16);
    CHECK(r->file_slots() == (kernel_has_file_table() ? 16u : 0u));
    CHECK(reactor::create(reactor::options{})->file_slots() == 0);  // none unless asked for
  }

  TEST_CASE("registered files: a send aimed at a slot reaches the peer, and once the slot is given back the close is the last reference") {
    if (!kernel_has_file_table()) return;  // no table here: the case above checked that
    auto r = reactor_with_files(8192);
    socket_pair sp;
    file_slot slot = r->register_file(sp.fd[0]);
    REQUIRE(slot.valid());
    CHECK(r->files_registered() == 1);
    // A send through the slot, with a plain fd that names nothing: the
    // kernel took the file from the table.
    CHECK(send_via(*r, -1, slot, "hello") == 5);
    char buf[16];
    CHECK(::recv(sp.fd[1], buf, sizeof buf, MSG_DONTWAIT) == 5);
    CHECK(std::string_view(buf, 5) == "hello");

    r->unregister_file(slot);
    CHECK_FALSE(slot.valid());
    CHECK(r->files_registered() == 0);
    ::close(sp.fd[0]);
    sp.fd[0] = -1;
    // Still in the table until the update is submitted: the peer sees no
    // end of stream yet.
    CHECK(::recv(sp.fd[1], buf, sizeof buf, MSG_DONTWAIT) == -1);
    r->run_once(0);
    CHECK(::recv(sp.fd[1], buf, sizeof buf, MSG_DONTWAIT) == 0);
  }

  TEST_CASE("registered files: a full table gives no slot and the plain fd serves; a slot given back is taken again") {
    if (!kernel_has_file_table()) return;  // no table here: the first case checked that
    auto r = reactor_with_files(1);
    socket_pair a, b;
    file_slot first = r->register_file(a.fd[0]);
    REQUIRE(first.valid());
    file_slot second = r->register_file(b.fd[0]);
    CHECK_FALSE(second.valid());
    CHECK(send_via(*r, b.fd[0], second, "plain") == 5);
    char buf[16];
    CHECK(::recv(b.fd[1], buf, sizeof buf, MSG_DONTWAIT) == 5);
    r->unregister_file(second);  // none: nothing to give back
    CHECK(r->files_registered() == 1);

    r->unregister_file(first);
    // Given back and taken in the same turn: the updates go in order, so
    // the slot holds the second socket when the send is issued.
    file_slot again = r->register_file(b.fd[0]);
    REQUIRE(again.valid());
    CHECK(again.index == 0);
    CHECK(send_via(*r, -1, again, "again") == 5);
    CHECK(::recv(b.fd[1], buf, sizeof buf, MSG_DONTWAIT) == 5);
    CHECK(std::string_view(buf, 5) == "again");
    CHECK(::recv(a.fd[1], buf, sizeof buf, MSG_DONTWAIT) == -1);  // nothing went to the first
    r->unregister_file(again);
    r->run_once(0);
  }

  TEST_CASE("registered files: file_slots = 0 makes no table, and every fd is served plain") {
    auto r = reactor_with_files(0);
    socket_pair sp;
    file_slot slot = r->register_file(sp.fd[0]);
    CHECK_FALSE(slot.valid());
    CHECK(send_via(*r, sp.fd[0], slot, "plain") == 5);
  }

  TEST_CASE("a completion's handler runs with its own CQE") {
    auto r = reactor::create(reactor::options{});
    REQUIRE(r != nullptr);
    nop_probe p;
    io_uring_prep_nop(r->sqe(&p));
    for (int i = 0; i < 50 && p.calls == 0; ++i) r->run_once(100);
    CHECK(p.calls == 1);
    CHECK(p.res == 0);
  }

  TEST_CASE("wall_ms is the wall clock of the iteration's instant, from its start and after a second of waits") {
    auto r = reactor::create(reactor::options{});
    REQUIRE(r != nullptr);
    const auto bracket = [&] {
      const uint64_t before = sluice::realtime_ms();
      nop_probe p;
      io_uring_prep_nop(r->sqe(&p));
      while (p.calls == 0) r->run_once(100);
      const uint64_t after = sluice::realtime_ms();
      // Both clocks are read to the millisecond: one of rounding either way.
      CHECK(r->wall_ms() + 1 >= before);
      CHECK(r->wall_ms() <= after + 1);
    };
    bracket();
    const uint64_t start = r->now_ms();
    while (r->now_ms() - start < 1200) r->run_once(100);  // idle: each waits its timeout
    bracket();
  }

  TEST_CASE("another thread's wake() ends a loop that waits with nothing to do") {
    reactor::options o;
    o.tick_ms = 60000;  // without the wake-up the loop would sleep a minute
    auto r = reactor::create(o);
    REQUIRE(r != nullptr);
    std::atomic<bool> stop{false};
    struct ctx_t {
      reactor* r;
      std::atomic<bool>* stop;
      int iterations = 0;
    } ctx{r.get(), &stop};
    reactor::hooks h;
    h.ctx = &ctx;
    h.on_iteration = [](void* p, uint64_t) {
      auto* c = static_cast<ctx_t*>(p);
      ++c->iterations;
      if (c->stop->load()) c->r->stop();
    };
    std::thread waker([&] {
      stop = true;
      r->wake();
    });
    r->run(h);
    waker.join();
    CHECK(ctx.iterations >= 1);
    CHECK(r->stopping());
  }

  TEST_CASE("before_completions runs before the iteration's CQEs, and one posted during it waits for the next iteration") {
    // Plain flags: a NOP submitted in the hook completes inside the submit,
    // so its CQE is in the ring while the iteration's batch is handled.
    reactor::options o;
    o.single_issuer = false;
    o.defer_taskrun = false;
    auto r = reactor::create(o);
    REQUIRE(r != nullptr);
    struct probe : completion {
      int* hooks_run;
      int hooks_at_handler = -1;  // how many hooks had run when the handler ran
      explicit probe(int* h) : hooks_run(h) {
        fn = [](completion* c, const io_uring_cqe*) {
          auto* self = static_cast<probe*>(c);
          self->hooks_at_handler = *self->hooks_run;
        };
      }
    };
    struct ctx_t {
      reactor* r;
      int hooks_run = 0;
      unsigned ready_after_submit = 0;
      probe first{&hooks_run};
      probe second{&hooks_run};
    } ctx{r.get()};
    reactor::hooks h;
    h.ctx = &ctx;
    h.before_completions = [](void* p, uint64_t) {
      auto* c = static_cast<ctx_t*>(p);
      ++c->hooks_run;
      if (c->hooks_run == 1) {
        io_uring_prep_nop(c->r->sqe(&c->second));
        io_uring_submit(c->r->ring());
        c->ready_after_submit = io_uring_cq_ready(c->r->ring());
      }
    };
    h.on_iteration = [](void* p, uint64_t) {
      auto* c = static_cast<ctx_t*>(p);
      if (c->second.hooks_at_handler != -1 || c->hooks_run > 50) c->r->stop();
    };
    io_uring_prep_nop(r->sqe(&ctx.first));
    r->run(h);
    REQUIRE(ctx.ready_after_submit == 2);  // both CQEs were there in the first iteration
    CHECK(ctx.first.hooks_at_handler == 1);   // the first iteration's hook ran before it
    CHECK(ctx.second.hooks_at_handler == 2);  // handled after the second hook, not in the first batch
  }

  TEST_CASE("the ring falls back to plain flags when asked not to use the newer ones") {
    reactor::options o;
    o.single_issuer = false;
    o.defer_taskrun = false;
    auto r = reactor::create(o);
    REQUIRE(r != nullptr);
    CHECK(std::string_view(r->setup_mode()).find("single_issuer") == std::string_view::npos);
  }

  TEST_CASE("polling: a completion already there after the submit is taken without a poll") {
    auto r = polling_reactor(1000);
    REQUIRE(r != nullptr);
    nop_probe p;
    io_uring_prep_nop(r->sqe(&p));
    CHECK(r->run_once(1000) >= 1);
    CHECK(p.calls == 1);
    CHECK(r->polls().caught == 0);
    CHECK(r->polls().missed == 0);
  }

  TEST_CASE("polling: a completion that comes within the window is caught by the poll") {
    auto r = polling_reactor(1000, 60000);  // a sleep would be long: only the poll returns at once
    REQUIRE(r != nullptr);
    nop_probe p;
    __kernel_timespec ts{};
    ts.tv_nsec = 50'000;  // 50 µs, well inside the 1 ms window
    io_uring_prep_timeout(r->sqe(&p), &ts, 0, 0);
    r->run_once(60000);
    CHECK(p.calls == 1);
    CHECK(p.res == -ETIME);
    CHECK(r->polls().missed == 0);
    // With DEFER_TASKRUN the timer's completion waits as task work until the
    // poll runs it. Without (5.19-6.0), a preemption between the submit and
    // the poll could run it first, and then no poll was needed.
    if (std::string_view(r->setup_mode()).find("defer_taskrun") != std::string_view::npos) {
      CHECK(r->polls().caught == 1);
    }
    CHECK(r->poll_window_ns() == 1'000'000);  // a caught wait leaves the window as it is
  }

  TEST_CASE("polling: with nothing to come the poll misses, the loop sleeps, and the long wait halves the window") {
    auto r = polling_reactor(100);
    REQUIRE(r != nullptr);
    CHECK(r->run_once(5) == 0);  // 100 µs of polling, then 5 ms asleep
    CHECK(r->polls().caught == 0);
    CHECK(r->polls().missed == 1);
    CHECK(r->polls().ns >= 100'000);
    CHECK(r->poll_window_ns() == 50'000);
  }

  TEST_CASE("polling: a call that does not wait does not poll") {
    auto r = polling_reactor(1000);
    REQUIRE(r != nullptr);
    CHECK(r->run_once(0) == 0);
    CHECK(r->polls().caught + r->polls().missed == 0);
    CHECK(r->poll_window_ns() == 1'000'000);
  }

  TEST_CASE("polling: a loop not allowed to poll, or set up without it, never polls") {
    reactor::options o;
    o.idle_poll_us = 100;
    auto r = reactor::create(o);
    REQUIRE(r != nullptr);
    CHECK(r->run_once(1) == 0);  // allow_poll not called: not allowed
    reactor::options off;
    off.idle_poll_us = 0;
    auto r0 = reactor::create(off);
    REQUIRE(r0 != nullptr);
    r0->allow_poll(true);
    CHECK(r0->run_once(1) == 0);
    CHECK(r->polls().caught + r->polls().missed + r0->polls().caught + r0->polls().missed == 0);
    CHECK(r->polls().ns + r0->polls().ns == 0);
  }

  TEST_CASE("batched waits: a wait that holds out for 3 completions handles the 3 in one iteration, submitting what was queued") {
    auto r = batching_reactor(2'000'000);  // 2 s: the batch's size, not its time, ends this wait
    if (!r->batch_waits()) return;  // an older kernel: checked above that it has none
    socket_pair sp[3];
    byte_recv p[3];
    for (int i = 0; i < 3; ++i) p[i].queue(*r, sp[i].fd[0]);  // not yet submitted: the wait submits them
    r->batch(3);
    const uint64_t t0 = sluice::monotonic_ns();
    delayed_writes w({{sp[0].fd[1], 5}, {sp[1].fd[1], 10}, {sp[2].fd[1], 15}});
    CHECK(r->run_once(60000) == 3);
    CHECK(elapsed_ms(t0) < 1000);
    for (const byte_recv& x : p) CHECK((x.calls == 1 && x.res == 1 && x.byte == 'x'));
    CHECK(r->batched_waits() == 1);
  }

  TEST_CASE("batched waits: a batch that does not fill ends at its time with what came, or at the first completion after it") {
    struct row {
      uint32_t batch_us;
      int byte_at_ms;
      uint64_t min_wait_ms;  // what the wait must have held out for
    };
    // A byte at 1 ms, 30 ms of batch time: held out past the byte for the
    // batch. Nothing within 2 ms of batch time: the byte at 100 ms ends it.
    for (const row& x : {row{30'000, 1, 29}, row{2'000, 100, 100}}) {
      CAPTURE(x.batch_us);
      auto r = batching_reactor(x.batch_us);
      if (!r->batch_waits()) return;
      socket_pair sp;
      byte_recv p;
      p.queue(*r, sp.fd[0]);
      r->batch(8);
      const uint64_t t0 = sluice::monotonic_ns();
      delayed_writes w({{sp.fd[1], x.byte_at_ms}});
      CHECK(r->run_once(60000) == 1);
      const uint64_t waited = elapsed_ms(t0);
      CHECK(waited >= x.min_wait_ms);
      CHECK(waited < 10'000);  // not the 60 s timeout: the 8 were never coming
      CHECK(p.calls == 1);
    }
  }

  TEST_CASE("batched waits: none with batch(1), with batch_wait_us = 0, or with completions already there") {
    for (const uint32_t us : {10'000'000u, 0u}) {
      CAPTURE(us);
      auto r = batching_reactor(us);  // 10 s when on: far from the ~1 ms of a wait it does not hold
      socket_pair sp[2];
      byte_recv first, late;
      first.queue(*r, sp[0].fd[0]);
      late.queue(*r, sp[1].fd[0]);  // no byte comes for it until the end
      r->batch(us == 0 ? 8 : 1);    // off either way: by the option, or by the owner
      const uint64_t t0 = sluice::monotonic_ns();
      {
        delayed_writes w({{sp[0].fd[1], 1}});
        CHECK(r->run_once(60000) == 1);
      }
      CHECK(elapsed_ms(t0) < 5000);  // the first completion ended the wait
      CHECK(first.calls == 1);
      CHECK(r->batched_waits() == 0);
      // A completion already in the ring is handled without a wait.
      nop_probe now;
      io_uring_prep_nop(r->sqe(&now));
      io_uring_submit(r->ring());
      r->batch(8);
      const uint64_t t1 = sluice::monotonic_ns();
      CHECK(r->run_once(60000) >= 1);
      CHECK(elapsed_ms(t1) < 5000);
      CHECK(now.calls == 1);
      CHECK(r->batched_waits() == 0);
      REQUIRE(::write(sp[1].fd[1], "x", 1) == 1);
      r->batch(1);
      for (int i = 0; i < 100 && late.calls == 0; ++i) r->run_once(100);
      CHECK(late.calls == 1);
    }
  }
}
