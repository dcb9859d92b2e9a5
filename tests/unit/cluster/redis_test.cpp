// redis_client against a real redis-server (tools/lib.sh installs it; a
// missing binary fails the test, it is never skipped).
#include <dirent.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <memory>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bucket_model.hpp"
#include "redis_server.hpp"
#include "sluice/cluster/redis_client.hpp"
#include "sluice/core/clock.hpp"
#include "sluice/shard/reactor.hpp"

using sluice::errc;
using sluice::result;
using sluice::cluster::bucket_reply;
using sluice::cluster::redis_client;
using sluice::cluster::redis_options;
using sluice::shard::reactor;
using sluice::test::redis_server;

namespace {

struct harness {
  std::unique_ptr<reactor> r;
  std::unique_ptr<redis_client> c;

  explicit harness(const redis_server& s, std::string password = "-") {
    reactor::options ro;
    ro.entries = 64;
    ro.tick_ms = 5;
    r = reactor::create(ro);
    REQUIRE(r != nullptr);
    redis_options o;
    o.port = s.port();
    o.password = password == "-" ? s.password() : password;
    o.key_prefix = "t:";
    o.timeout_ms = 200;
    o.connect_timeout_ms = 500;
    o.backoff_min_ms = 20;
    o.backoff_max_ms = 200;
    auto made = redis_client::create(*r, o);
    REQUIRE(made.ok());
    c = std::move(made.value());
    c->start();
  }

  // The client goes first; the polls it cancels complete on the ring, which
  // frees its io state (a reactor destroyed with them in flight would leak it).
  ~harness() {
    c.reset();
    for (int i = 0; i < 10; ++i) r->run_once(1);
  }
  harness(const harness&) = delete;
  harness& operator=(const harness&) = delete;

  // Runs the loop until `done` or `ms` pass. Returns: done().
  template <class Done>
  bool until(Done done, uint64_t ms = 3000) {
    const uint64_t end = sluice::monotonic_ms() + ms;
    while (!done()) {
      if (sluice::monotonic_ms() > end) return false;
      r->run_once(5);
      if (c) c->on_iteration(r->now_ms());
    }
    return true;
  }

  void spin(uint64_t ms) {
    until([] { return false; }, ms);
  }
};

// One call's outcome.
struct outcome {
  int calls = 0;
  std::optional<result<bucket_reply>> got;
  sluice::cluster::bucket_fn fn() {
    return [this](result<bucket_reply> r) {
      ++calls;
      got = r;
    };
  }
  bool done() const { return calls > 0; }
  const bucket_reply& value() const { return got->value(); }
};

size_t open_fds() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (::readdir(d) != nullptr) ++n;
  ::closedir(d);
  return n;
}

}  // namespace

TEST_SUITE("cluster::redis_client") {
  TEST_CASE("redis-server is installed (tools/lib.sh installs it)") {
    REQUIRE_MESSAGE(::access(sluice::test::k_redis_server, X_OK) == 0,
                    "redis-server is missing: apt-get install redis-server libhiredis-dev");
  }

  TEST_CASE("connects with AUTH; lease, give_back and charge keep the bucket on Redis's clock") {
    redis_server s("s3cret");
    REQUIRE(s.start());
    harness h(s);
    REQUIRE(h.until([&] { return h.c->connected(); }));

    outcome a;
    REQUIRE(h.c->lease("k1", 60000, 1000, "inst-a", 5000, a.fn()));
    REQUIRE(h.until([&] { return a.done(); }));
    REQUIRE(a.got->ok());
    CHECK(a.value().tokens == 1000);
    CHECK(a.value().level >= 59000);
    CHECK(a.value().level <= 59010);
    CHECK(a.value().outstanding == 1000);
    // TIME is Redis's clock; on one machine it reads as ours.
    const int64_t skew = a.value().server_now_ms - static_cast<int64_t>(sluice::realtime_ms());
    CHECK(skew > -5000);
    CHECK(skew < 5000);
    CHECK(s.integer({"PTTL", "t:bucket:k1"}) > 60000);

    SUBCASE("a lease takes at most the level; a second instance's lease adds to outstanding") {
      outcome b;
      REQUIRE(h.c->lease("k1", 60000, 100000, "inst-b", 5000, b.fn()));
      REQUIRE(h.until([&] { return b.done(); }));
      REQUIRE(b.got->ok());
      CHECK(b.value().tokens >= 59000);
      CHECK(b.value().tokens <= 59100);
      CHECK(b.value().level == 0);
      CHECK(b.value().outstanding == 1000 + b.value().tokens);

      outcome g;
      REQUIRE(h.c->give_back("k1", 60000, 500, "inst-b", g.fn()));
      REQUIRE(h.until([&] { return g.done(); }));
      REQUIRE(g.got->ok());
      CHECK(g.value().tokens >= 499);
      CHECK(g.value().tokens <= 500);
      CHECK(g.value().level >= 500);
      CHECK(g.value().outstanding == 1000 + b.value().tokens - 500);
    }

    SUBCASE("give_back caps the level at the limit") {
      outcome g;
      REQUIRE(h.c->give_back("k1", 60000, 5000, "inst-a", g.fn()));
      REQUIRE(h.until([&] { return g.done(); }));
      REQUIRE(g.got->ok());
      CHECK(g.value().level == 60000);
      CHECK(g.value().tokens <= 1000);
      CHECK(g.value().outstanding == 0);  // the record is gone with the whole lease back
    }

    SUBCASE("charge goes below zero, never below -limit, and later leases wait") {
      outcome ch;
      REQUIRE(h.c->charge("k1", 60000, 200000, "inst-a", ch.fn()));
      REQUIRE(h.until([&] { return ch.done(); }));
      REQUIRE(ch.got->ok());
      CHECK(ch.value().level == -60000);
      CHECK(ch.value().tokens >= 119000);
      CHECK(s.integer({"PTTL", "t:bucket:k1"}) > 179000);  // two minutes to refill + the margin
      outcome l;
      REQUIRE(h.c->lease("k1", 60000, 10, "inst-a", 5000, l.fn()));
      REQUIRE(h.until([&] { return l.done(); }));
      REQUIRE(l.got->ok());
      CHECK(l.value().tokens == 0);
      CHECK(l.value().level < 0);
    }

    SUBCASE("a lease past its TTL leaves the outstanding total") {
      outcome l;
      REQUIRE(h.c->lease("k2", 60000, 300, "inst-c", 50, l.fn()));
      REQUIRE(h.until([&] { return l.done(); }));
      REQUIRE(l.got->ok());
      CHECK(l.value().outstanding == 300);
      h.spin(120);
      outcome g;
      REQUIRE(h.c->give_back("k2", 60000, 0, "inst-d", g.fn()));
      REQUIRE(h.until([&] { return g.done(); }));
      REQUIRE(g.got->ok());
      CHECK(g.value().outstanding == 0);
      CHECK(s.integer({"HEXISTS", "t:bucket:k2", "l:inst-c"}) == 0);
    }

    SUBCASE("a bad argument is an error reply, not a dropped connection") {
      outcome e;
      REQUIRE(h.c->lease("k1", 0, 10, "inst-a", 5000, e.fn()));
      REQUIRE(h.until([&] { return e.done(); }));
      REQUIRE(!e.got->ok());
      CHECK(e.got->error() == errc::upstream_protocol);
      CHECK(h.c->last_error().find("limit must be > 0") != std::string::npos);
      CHECK(h.c->connected());
    }
    CHECK(h.c->stats().reconnects == 0);
  }

  TEST_CASE("a wrong password never connects, and is retried with backoff") {
    redis_server s("right");
    REQUIRE(s.start());
    harness h(s, "wrong");
    h.spin(400);
    CHECK(!h.c->connected());
    CHECK(h.c->stats().errors >= 2);
    CHECK(h.c->stats().reconnects >= 1);
    CHECK(h.c->stats().reconnects <= 6);  // 20, 40, 80, 160 ms...: backing off, not spinning
    CHECK(h.c->last_error().find("AUTH") != std::string::npos);
    outcome a;
    CHECK(!h.c->lease("k", 60000, 1, "i", 1000, a.fn()));  // not sent, never called
    h.spin(20);
    CHECK(a.calls == 0);
  }

  TEST_CASE("a stopped server: every pending command times out once; the client reconnects after SIGCONT") {
    redis_server s;
    REQUIRE(s.start());
    harness h(s);
    REQUIRE(h.until([&] { return h.c->connected(); }));
    s.pause();
    outcome a, b, c;
    // The client's deadlines start from its loop's clock (cached per turn,
    // so up to a turn behind monotonic_ms()): measure from that.
    const uint64_t sent = h.r->now_ms();
    REQUIRE(h.c->lease("k", 60000, 10, "i", 1000, a.fn()));
    REQUIRE(h.c->lease("k", 60000, 10, "i", 1000, b.fn()));
    REQUIRE(h.c->give_back("k", 60000, 10, "i", c.fn()));
    REQUIRE(h.until([&] { return a.done() && b.done() && c.done(); }));
    const uint64_t took = sluice::monotonic_ms() - sent;
    CHECK(took >= 200);
    CHECK(took < 1000);
    for (outcome* o : {&a, &b, &c}) {
      CHECK(o->calls == 1);
      REQUIRE(!o->got->ok());
      CHECK(o->got->error() == errc::upstream_timeout);
    }
    CHECK(!h.c->connected());
    h.spin(300);  // reconnect attempts against the stopped server time out too
    CHECK(a.calls == 1);
    s.resume();
    REQUIRE(h.until([&] { return h.c->connected(); }, 5000));
    outcome d;
    REQUIRE(h.c->lease("k", 60000, 10, "i", 1000, d.fn()));
    REQUIRE(h.until([&] { return d.done(); }));
    CHECK(d.got->ok());
    CHECK(h.c->stats().errors >= 4);
  }

  TEST_CASE("a killed server: pending commands fail once; the restarted one is reconnected") {
    redis_server s;
    REQUIRE(s.start());
    harness h(s);
    REQUIRE(h.until([&] { return h.c->connected(); }));
    outcome first;
    REQUIRE(h.c->lease("k", 60000, 60000, "i", 1000, first.fn()));
    REQUIRE(h.until([&] { return first.done(); }));
    REQUIRE(first.got->ok());
    CHECK(first.value().level == 0);

    s.stop();
    outcome a;
    if (h.c->lease("k", 60000, 10, "i", 1000, a.fn())) {
      REQUIRE(h.until([&] { return a.done(); }));
      CHECK(a.calls == 1);
      REQUIRE(!a.got->ok());
      CHECK((a.got->error() == errc::upstream_closed || a.got->error() == errc::upstream_timeout));
    }
    REQUIRE(h.until([&] { return !h.c->connected(); }));
    h.spin(100);
    REQUIRE(s.start());
    REQUIRE(h.until([&] { return h.c->connected(); }, 5000));
    CHECK(h.c->stats().reconnects >= 1);
    // A restart without persistence starts the bucket full again.
    outcome b;
    REQUIRE(h.c->lease("k", 60000, 100, "i", 1000, b.fn()));
    REQUIRE(h.until([&] { return b.done(); }));
    REQUIRE(b.got->ok());
    CHECK(b.value().tokens == 100);
    CHECK(b.value().level == 59900);
  }

  TEST_CASE("NOSCRIPT after SCRIPT FLUSH: the call goes again as EVAL, which caches the script") {
    redis_server s;
    REQUIRE(s.start());
    harness h(s);
    REQUIRE(h.until([&] { return h.c->connected(); }));
    redisReply* flushed = s.command({"SCRIPT", "FLUSH"});
    REQUIRE(flushed != nullptr);
    freeReplyObject(flushed);
    outcome a;
    REQUIRE(h.c->lease("k", 60000, 7, "i", 1000, a.fn()));
    REQUIRE(h.until([&] { return a.done(); }));
    REQUIRE(a.got->ok());
    CHECK(a.value().tokens == 7);
    CHECK(h.c->stats().noscript == 1);
    outcome b;
    REQUIRE(h.c->lease("k", 60000, 7, "i", 1000, b.fn()));
    REQUIRE(h.until([&] { return b.done(); }));
    REQUIRE(b.got->ok());
    CHECK(h.c->stats().noscript == 1);
    CHECK(h.c->stats().commands == 3);
    CHECK(h.c->connected());
  }

  TEST_CASE("a destroyed client never calls back, and its fd closes once its polls are back") {
    redis_server s;
    REQUIRE(s.start());
    const size_t fds_before = open_fds();
    {
      harness h(s);
      REQUIRE(h.until([&] { return h.c->connected(); }));
      CHECK(open_fds() > fds_before);
      outcome a;
      REQUIRE(h.c->lease("k", 60000, 10, "i", 1000, a.fn()));
      h.c.reset();
      h.spin(100);  // the cancelled polls come back; the fd closes then
      CHECK(a.calls == 0);
      CHECK(open_fds() == fds_before + 2);  // the reactor's ring and eventfd remain
    }
    CHECK(open_fds() == fds_before);
  }

  TEST_CASE("many reconnects leak no fd") {
    redis_server s;
    REQUIRE(s.start());
    harness h(s);
    REQUIRE(h.until([&] { return h.c->connected(); }));
    const size_t fds = open_fds();
    for (int i = 0; i < 5; ++i) {
      redisReply* killed = s.command({"CLIENT", "KILL", "TYPE", "normal"});
      if (killed != nullptr) freeReplyObject(killed);
      REQUIRE(h.until([&] { return !h.c->connected(); }));
      REQUIRE(h.until([&] { return h.c->connected(); }));
    }
    h.spin(20);
    CHECK(open_fds() == fds);
    CHECK(h.c->stats().reconnects == 5);
  }

  TEST_CASE("the scripts agree with bucket_model over a seeded run of calls (the simulation's Redis)") {
    redis_server s;
    REQUIRE(s.start());
    harness h(s);
    REQUIRE(h.until([&] { return h.c->connected(); }));
    std::mt19937_64 rng(7);
    std::map<int, sluice::test::bucket_model> models;  // per key, made at its first call's server time
    const double limit = 6000;  // 100 tokens per second: refill shows within a few ms' spin
    for (int i = 0; i < 300; ++i) {
      const int key = static_cast<int>(rng() % 2);
      const int inst = static_cast<int>(rng() % 3);
      const int kind = static_cast<int>(rng() % 4);  // lease twice as often
      const uint64_t amount = rng() % 2500;
      const uint32_t ttl_ms = 20 + static_cast<uint32_t>(rng() % 60);
      const std::string key_id = key == 0 ? "d0" : "d1";
      const std::string inst_id = std::to_string(inst);
      outcome o;
      bool sent = false;
      if (kind <= 1) sent = h.c->lease(key_id, 6000, amount, inst_id, ttl_ms, o.fn());
      if (kind == 2) sent = h.c->give_back(key_id, 6000, amount, inst_id, o.fn());
      if (kind == 3) sent = h.c->charge(key_id, 6000, amount / 2, inst_id, o.fn());
      REQUIRE(sent);
      REQUIRE(h.until([&] { return o.done(); }));
      REQUIRE(o.got->ok());
      const bucket_reply& got = o.value();
      const auto now = static_cast<uint64_t>(got.server_now_ms);
      auto [it, fresh] = models.try_emplace(key, limit, now);
      sluice::test::bucket_model& m = it->second;
      double tokens = 0;
      if (kind <= 1) tokens = m.lease(static_cast<double>(amount), inst, ttl_ms, now);
      if (kind == 2) tokens = m.give_back(static_cast<double>(amount), inst, now);
      if (kind == 3) tokens = m.charge(static_cast<double>(amount / 2), now);
      CAPTURE(i);
      CAPTURE(kind);
      // The model repeats the Lua's double arithmetic: exact agreement.
      CHECK(static_cast<int64_t>(std::floor(tokens)) == got.tokens);
      CHECK(static_cast<int64_t>(std::floor(m.answered_level)) == got.level);
      CHECK(static_cast<int64_t>(std::floor(m.outstanding())) == got.outstanding);
      if (rng() % 4 == 0) h.spin(rng() % 40);
    }
  }
}
