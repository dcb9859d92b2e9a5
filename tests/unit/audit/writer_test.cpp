#include <dirent.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <simdjson.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sluice/audit/writer.hpp"

using sluice::audit::record;
using sluice::audit::writer;
using sluice::shard::reactor;

namespace {

// A fresh directory under $TMPDIR, removed with its files at scope end.
struct temp_dir {
  std::string path;
  temp_dir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/sluice-audit-XXXXXX";
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~temp_dir() {
    for (const char* f : {"/audit.jsonl", "/audit.jsonl.1", "/real.jsonl"}) ::unlink((path + f).c_str());
    ::rmdir(path.c_str());
  }
};

std::vector<std::string> read_lines(const std::string& path, bool* ends_with_newline = nullptr) {
  std::string all;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) all.append(buf, n);
    std::fclose(f);
  }
  if (ends_with_newline != nullptr) *ends_with_newline = all.empty() || all.back() == '\n';
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < all.size()) {
    size_t nl = all.find('\n', start);
    if (nl == std::string::npos) nl = all.size();
    lines.emplace_back(all, start, nl - start);
    start = nl + 1;
  }
  return lines;
}

// Every line must be a whole JSON object; returns its request_id.
std::string request_id_of(simdjson::dom::parser& p, const std::string& line) {
  simdjson::dom::element e;
  REQUIRE_MESSAGE(p.parse(line).get(e) == simdjson::SUCCESS, line);
  std::string_view id;
  REQUIRE(e["request_id"].get(id) == simdjson::SUCCESS);
  return std::string(id);
}

std::unique_ptr<reactor> make_reactor() {
  auto r = reactor::create(reactor::options{});
  REQUIRE(r != nullptr);
  return r;
}

// The one fd of this process open on `target` (the writer's, found from the
// outside so that the test can swap the file under it with dup2).
int fd_open_on(const std::string& target) {
  int found = -1;
  DIR* d = ::opendir("/proc/self/fd");
  REQUIRE(d != nullptr);
  while (dirent* e = ::readdir(d)) {
    char link[256];
    const std::string entry = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = ::readlink(entry.c_str(), link, sizeof link - 1);
    if (n <= 0) continue;
    if (std::string(link, static_cast<size_t>(n)) != target) continue;
    REQUIRE(found < 0);
    found = std::atoi(e->d_name);
  }
  ::closedir(d);
  REQUIRE(found >= 0);
  return found;
}

// Runs the reactor (no tick: the writer's clock stays put) until `done`.
template <class F>
void run_until(reactor& r, F done) {
  for (int i = 0; i < 500 && !done(); ++i) r.run_once(10);
  REQUIRE(done());
}

// Lets completions already due arrive, without moving the writer's clock:
// for checking that nothing happens before a tick says it is time.
void let_completions_in(reactor& r) {
  for (int i = 0; i < 3; ++i) r.run_once(0);
}

// Appends, letting the reactor make room when both buffers are busy: the
// tests want every line, so they apply the back-pressure the proxy does not.
void append_all(reactor& r, writer& w, const record& rec) {
  while (!w.append(rec)) r.run_once(1);
}

}  // namespace

TEST_SUITE("audit::writer") {
  TEST_CASE("N records become exactly N whole lines, in order") {
    temp_dir dir;
    const std::string path = dir.path + "/audit.jsonl";
    auto r = make_reactor();
    writer::options o;
    o.buffer_bytes = 32 * 1024;  // small: many batches
    // No burst growth: how many batches it takes must not depend on how
    // fast the disk completes writes (append_all waits instead).
    o.max_buffer_bytes = o.buffer_bytes;
    auto w = writer::open(*r, path, o);
    REQUIRE(w != nullptr);
    constexpr int n = 20000;
    std::string pad(300, 'p');
    uint64_t now_ms = 0;
    for (int i = 0; i < n; ++i) {
      std::string id = "req-" + std::to_string(i);
      record rec;
      rec.request_id = id;
      rec.model = std::string_view(pad).substr(0, static_cast<size_t>(i % 300));
      rec.status = 200;
      append_all(*r, *w, rec);
      if (i % 100 == 0) {
        r->run_once(0);
        w->tick(now_ms += 7);
      }
    }
    CHECK(w->close());
    CHECK(w->stats().lines_written.get() == n);
    CHECK(w->stats().lines_appended.get() == n);
    CHECK(w->stats().write_errors.get() == 0);
    CHECK(w->stats().batches_written.get() > 10);
    bool ends_nl = false;
    auto lines = read_lines(path, &ends_nl);
    CHECK(ends_nl);
    REQUIRE(lines.size() == n);
    simdjson::dom::parser p;
    for (int i = 0; i < n; ++i) CHECK(request_id_of(p, lines[static_cast<size_t>(i)]) == "req-" + std::to_string(i));
  }

  TEST_CASE("a batch waits for the flush interval, then is written") {
    temp_dir dir;
    const std::string path = dir.path + "/audit.jsonl";
    auto r = make_reactor();
    writer::options o;
    o.flush_interval_ms = 100;
    auto w = writer::open(*r, path, o);
    REQUIRE(w != nullptr);
    w->tick(1000);
    record rec;
    rec.request_id = "only";
    REQUIRE(w->append(rec));
    w->tick(1099);
    for (int i = 0; i < 3; ++i) r->run_once(0);
    CHECK(read_lines(path).empty());
    CHECK_FALSE(w->idle());
    w->tick(1100);
    for (int i = 0; i < 200 && !w->idle(); ++i) r->run_once(10);
    CHECK(w->idle());
    CHECK(read_lines(path).size() == 1);
    CHECK(w->close());
  }

  TEST_CASE("when both buffers are busy the filling one grows: a burst loses no record") {
    temp_dir dir;
    const std::string path = dir.path + "/audit.jsonl";
    auto r = make_reactor();
    writer::options o;
    o.buffer_bytes = 20 * 1024;
    auto w = writer::open(*r, path, o);
    REQUIRE(w != nullptr);
    record rec;
    rec.request_id = "x";
    rec.model = std::string_view("mmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm");
    // The reactor does not run: the first batch's CQE is never handled, so
    // the second buffer fills and has to grow.
    int accepted = 0;
    for (int i = 0; i < 5000; ++i) accepted += w->append(rec) ? 1 : 0;
    CHECK(accepted == 5000);
    CHECK(w->stats().lines_dropped.get() == 0);
    CHECK(w->stats().buffer_grows.get() > 0);
    CHECK(w->close());
    CHECK(read_lines(path).size() == 5000);
  }

  TEST_CASE("past max_buffer_bytes a record is dropped and counted, never blocked on") {
    temp_dir dir;
    const std::string path = dir.path + "/audit.jsonl";
    auto r = make_reactor();
    writer::options o;
    o.buffer_bytes = 20 * 1024;
    o.max_buffer_bytes = 40 * 1024;
    auto w = writer::open(*r, path, o);
    REQUIRE(w != nullptr);
    record rec;
    rec.request_id = "x";
    rec.model = std::string_view("mmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm");
    int accepted = 0, dropped = 0;
    for (int i = 0; i < 2000; ++i) (w->append(rec) ? accepted : dropped) += 1;
    CHECK(dropped > 0);
    CHECK(accepted > 0);
    CHECK(w->stats().lines_dropped.get() == static_cast<uint64_t>(dropped));
    CHECK(w->close());
    CHECK(read_lines(path).size() == static_cast<size_t>(accepted));
  }

  TEST_CASE("shutdown flush writes everything appended, including a half-full batch") {
    temp_dir dir;
    const std::string path = dir.path + "/audit.jsonl";
    auto r = make_reactor();
    writer::options o;
    o.buffer_bytes = 64 * 1024;
    o.flush_interval_ms = 60000;  // the timer never fires here
    auto w = writer::open(*r, path, o);
    REQUIRE(w != nullptr);
    int accepted = 0;
    record rec;
    rec.request_id = "shutdown";
    for (int i = 0; i < 3000; ++i) accepted += w->append(rec) ? 1 : 0;
    REQUIRE(accepted > 0);
    CHECK(w->close(5000));
    CHECK(w->idle());
    CHECK(read_lines(path).size() == static_cast<size_t>(accepted));
    CHECK(w->stats().lines_written.get() == static_cast<uint64_t>(accepted));
    CHECK_FALSE(w->append(rec));  // closed: dropped, not crashed
  }

  TEST_CASE("a failed write is retried after a doubling, capped backoff, and its lines arrive") {
    temp_dir dir;
    const std::string real = dir.path + "/real.jsonl";
    auto r = make_reactor();
    writer::options o;
    o.flush_interval_ms = 10;
    o.retry_backoff_ms = 100;
    o.retry_backoff_max_ms = 400;
    auto w = writer::open(*r, "/dev/full", o);  // every write: ENOSPC
    REQUIRE(w != nullptr);
    const int fd = fd_open_on("/dev/full");
    record rec;
    rec.request_id = "kept-0";
    w->tick(1000);
    REQUIRE(w->append(rec));
    rec.request_id = "kept-1";
    REQUIRE(w->append(rec));
    w->tick(1010);  // the batch goes out, and fails
    run_until(*r, [&] { return w->stats().write_errors.get() == 1; });
    // The failures, each after twice the wait of the one before, up to 400 ms.
    for (uint64_t at : {1110u, 1310u, 1710u, 2110u}) {
      w->tick(at - 1);
      let_completions_in(*r);
      const uint64_t before = w->stats().write_errors.get();
      CHECK(before < 5);
      w->tick(at);
      run_until(*r, [&] { return w->stats().write_errors.get() == before + 1; });
    }
    CHECK(w->stats().write_errors.get() == 5);
    CHECK(w->stats().lines_lost.get() == 0);
    CHECK(w->stats().lines_written.get() == 0);
    CHECK_FALSE(w->idle());
    // The disk recovers: the writer's fd now leads to a real file.
    const int file = ::open(real.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    REQUIRE(file >= 0);
    REQUIRE(::dup2(file, fd) == fd);
    ::close(file);
    w->tick(2510);
    run_until(*r, [&] { return w->idle(); });
    CHECK(w->stats().lines_written.get() == 2);
    CHECK(w->stats().lines_lost.get() == 0);
    CHECK(w->stats().write_errors.get() == 5);
    const auto lines = read_lines(real);
    REQUIRE(lines.size() == 2);
    simdjson::dom::parser p;
    CHECK(request_id_of(p, lines[0]) == "kept-0");
    CHECK(request_id_of(p, lines[1]) == "kept-1");
    CHECK(w->close());
  }

  TEST_CASE("lines are given up only by close, once its timeout has passed") {
    auto r = make_reactor();
    auto w = writer::open(*r, "/dev/full", writer::options{});
    REQUIRE(w != nullptr);
    record rec;
    rec.request_id = "doomed";
    REQUIRE(w->append(rec));
    REQUIRE(w->append(rec));
    CHECK_FALSE(w->flush_and_wait(150));
    CHECK(w->stats().write_errors.get() >= 1);
    CHECK(w->stats().lines_lost.get() == 0);  // still kept for a retry
    REQUIRE(w->append(rec));                  // and the writer still takes lines
    CHECK_FALSE(w->close(150));
    CHECK(w->stats().lines_lost.get() == 3);
    CHECK(w->stats().lines_written.get() == 0);
    CHECK(w->idle());
  }

  TEST_CASE("a batch failing on the old file goes to the new one after a reopen") {
    temp_dir dir;
    const std::string path = dir.path + "/audit.jsonl";
    REQUIRE(::symlink("/dev/full", path.c_str()) == 0);
    auto r = make_reactor();
    writer::options o;
    o.retry_backoff_ms = 60000;  // only the reopen can make it go again before the test ends
    auto w = writer::open(*r, path, o);
    REQUIRE(w != nullptr);
    record rec;
    rec.request_id = "moved";
    REQUIRE(w->append(rec));
    w->flush();
    run_until(*r, [&] { return w->stats().write_errors.get() == 1; });
    // logrotate's part: the broken file goes away, a regular one takes its name.
    REQUIRE(::unlink(path.c_str()) == 0);
    REQUIRE(w->reopen());
    run_until(*r, [&] { return w->idle(); });
    CHECK(w->stats().lines_written.get() == 1);
    CHECK(w->stats().lines_lost.get() == 0);
    CHECK(read_lines(path).size() == 1);
    CHECK(w->close());
  }

  TEST_CASE("written bytes are fsync'ed per fsync_interval_ms, by the time tick() is given") {
    temp_dir dir;
    const std::string path = dir.path + "/audit.jsonl";
    auto r = make_reactor();
    writer::options o;
    o.flush_interval_ms = 10;
    record rec;
    rec.request_id = "synced";

    SUBCASE("once the interval has passed since the write, never more often") {
      o.fsync_interval_ms = 1000;
      auto w = writer::open(*r, path, o);
      REQUIRE(w != nullptr);
      w->tick(5000);
      let_completions_in(*r);
      CHECK(w->stats().fsyncs.get() == 0);  // nothing written: nothing to sync
      REQUIRE(w->append(rec));
      w->tick(5010);
      run_until(*r, [&] { return w->idle(); });  // written at tick 5010
      w->tick(6009);
      let_completions_in(*r);
      CHECK(w->stats().fsyncs.get() == 0);
      w->tick(6010);
      run_until(*r, [&] { return w->stats().fsyncs.get() == 1; });
      // Written right after that fsync: the next one waits a whole interval.
      REQUIRE(w->append(rec));
      w->tick(6020);
      run_until(*r, [&] { return w->stats().lines_written.get() == 2; });
      w->tick(7019);
      let_completions_in(*r);
      CHECK(w->stats().fsyncs.get() == 1);
      w->tick(7020);
      run_until(*r, [&] { return w->stats().fsyncs.get() == 2; });
      w->tick(20000);
      let_completions_in(*r);
      CHECK(w->stats().fsyncs.get() == 2);  // nothing new written since
      CHECK(w->stats().fsync_errors.get() == 0);
      CHECK(w->close());
    }

    SUBCASE("0: after every batch") {
      o.fsync_interval_ms = 0;
      auto w = writer::open(*r, path, o);
      REQUIRE(w != nullptr);
      uint64_t now_ms = 1000;
      for (uint64_t n = 1; n <= 3; ++n) {
        w->tick(now_ms);
        REQUIRE(w->append(rec));
        w->tick(now_ms += 10);
        run_until(*r, [&] { return w->stats().fsyncs.get() == n; });
        CHECK(w->stats().batches_written.get() == n);
      }
      CHECK(w->close());
      CHECK(w->stats().fsyncs.get() == 3);
    }
  }

  TEST_CASE("opening a path that cannot be created fails with nullptr") {
    auto r = make_reactor();
    CHECK(writer::open(*r, "/nonexistent-dir/x/audit.jsonl", writer::options{}) == nullptr);
  }

  TEST_CASE("rotation under load by several shards loses no line and tears none") {
    temp_dir dir;
    const std::string path = dir.path + "/audit.jsonl";
    const std::string rotated = path + ".1";
    constexpr int shards = 4;
    constexpr int per_shard = 20000;
    std::atomic<int> appended_total{0};
    std::atomic<bool> rotate{false};
    std::atomic<int> reopened{0};
    std::vector<std::thread> threads;
    std::vector<uint64_t> written(shards), lost(shards);
    for (int s = 0; s < shards; ++s) {
      threads.emplace_back([&, s] {
        auto r = reactor::create(reactor::options{});
        if (r == nullptr) return;
        writer::options o;
        o.buffer_bytes = 32 * 1024;
        o.shard = static_cast<unsigned>(s);
        auto w = writer::open(*r, path, o);
        if (w == nullptr) return;
        bool done_reopen = false;
        std::string pad(200, static_cast<char>('a' + s));
        for (int i = 0; i < per_shard; ++i) {
          std::string id = std::to_string(s) + ":" + std::to_string(i);
          record rec;
          rec.request_id = id;
          rec.model = std::string_view(pad).substr(0, static_cast<size_t>((i * 7) % 200));
          while (!w->append(rec)) r->run_once(1);
          appended_total.fetch_add(1, std::memory_order_relaxed);
          if (i % 64 == 0) r->run_once(0);
          // The SIGUSR1 broadcast: each shard reopens once it sees it.
          if (!done_reopen && rotate.load(std::memory_order_acquire)) {
            done_reopen = w->reopen();
            reopened.fetch_add(done_reopen ? 1 : 0);
          }
        }
        // A shard that finished before the rename still takes the SIGUSR1.
        if (!done_reopen) {
          while (!rotate.load(std::memory_order_acquire)) std::this_thread::yield();
          reopened.fetch_add(w->reopen() ? 1 : 0);
        }
        w->close(10000);
        written[static_cast<size_t>(s)] = w->stats().lines_written.get();
        lost[static_cast<size_t>(s)] = w->stats().lines_lost.get();
      });
    }
    // The rotation (logrotate's rename) happens while the shards write.
    while (appended_total.load(std::memory_order_relaxed) < shards * per_shard / 3) std::this_thread::yield();
    REQUIRE(::rename(path.c_str(), rotated.c_str()) == 0);
    rotate.store(true, std::memory_order_release);
    for (auto& t : threads) t.join();
    CHECK(reopened.load() == shards);

    std::vector<std::vector<char>> seen(shards, std::vector<char>(per_shard, 0));
    simdjson::dom::parser p;
    size_t old_lines = 0, new_lines = 0;
    for (const std::string& file : {rotated, path}) {
      bool ends_nl = false;
      auto lines = read_lines(file, &ends_nl);
      CHECK(ends_nl);
      (file == path ? new_lines : old_lines) = lines.size();
      std::vector<int> last(shards, -1);
      for (const std::string& line : lines) {
        const std::string id = request_id_of(p, line);  // fails on a torn line
        const size_t colon = id.find(':');
        REQUIRE(colon != std::string::npos);
        const int s = std::stoi(id.substr(0, colon));
        const int i = std::stoi(id.substr(colon + 1));
        REQUIRE(s >= 0);
        REQUIRE(s < shards);
        REQUIRE(i >= 0);
        REQUIRE(i < per_shard);
        CHECK(seen[static_cast<size_t>(s)][static_cast<size_t>(i)] == 0);
        seen[static_cast<size_t>(s)][static_cast<size_t>(i)] = 1;
        CHECK(i > last[static_cast<size_t>(s)]);  // each shard's lines stay in order within a file
        last[static_cast<size_t>(s)] = i;
      }
    }
    CHECK(old_lines > 0);
    CHECK(new_lines > 0);
    size_t missing = 0;
    for (const auto& v : seen) {
      for (char c : v) missing += c == 0 ? 1 : 0;
    }
    CHECK(missing == 0);
    for (int s = 0; s < shards; ++s) {
      CHECK(written[static_cast<size_t>(s)] == per_shard);
      CHECK(lost[static_cast<size_t>(s)] == 0);
    }
  }
}
