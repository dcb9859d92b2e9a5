// Budgets kept in Redis: the budget script, and ledgers of several
// "instances" (each a board, a ledger and a redis_budget_store with its own
// instance id) sharing one real redis-server. Wall time is a parameter of
// every step and save; only Redis's replies are waited for (bounded).
#include <doctest/doctest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "redis_server.hpp"
#include "sluice/cluster/budget_store.hpp"
#include "sluice/cluster/redis_client.hpp"
#include "sluice/config/config.hpp"
#include "sluice/core/clock.hpp"
#include "sluice/quota/budget.hpp"
#include "sluice/shard/reactor.hpp"

using namespace sluice::quota;
using sluice::result;
using sluice::cluster::budget_counter;
using sluice::cluster::budget_sums;
using sluice::cluster::redis_budget_store;
using sluice::cluster::redis_client;
using sluice::cluster::redis_options;
using sluice::shard::reactor;
using sluice::test::redis_server;
namespace cfg = sluice::config;

namespace {

int64_t at(int32_t y, uint32_t m, uint32_t d, int64_t hh = 0, int64_t mm = 0, int64_t ss = 0, int64_t ms = 0) {
  return days_from_civil({y, m, d}) * 86'400'000 + ((hh * 60 + mm) * 60 + ss) * 1000 + ms;
}

// The tests' calendar year. Redis expires a window's hash by its own
// wall clock (PEXPIREAT: the window's end + k_expiry_margin_ms), so the
// windows written here must lie ahead of the real date: a window of last
// week would be dropped as soon as it is written, and a test that passes
// today would fail three days after the dates it names.
constexpr int32_t k_year = 2098;

constexpr std::string_view k_config = R"(
[quota]
budget_state_file = ""

[[group]]
name = "g"
models = ["*"]
backends = ["http://127.0.0.1:9"]
daily_tokens = 100
input_cost_per_mtok = 1000
output_cost_per_mtok = 2000

[[key]]
id = "alice"
key = "sk-a"
daily_tokens = 50
monthly_tokens = 120
daily_spend = 0.5

[[key]]
id = "bob"
key = "sk-b"
)";

redis_options options_for(const redis_server& s) {
  redis_options o;
  o.port = s.port();
  o.key_prefix = "t:";
  o.timeout_ms = 200;
  o.connect_timeout_ms = 500;
  o.backoff_min_ms = 20;
  o.backoff_max_ms = 100;
  return o;
}

// The loop every instance of a test shares (the control thread's).
struct loop {
  std::unique_ptr<reactor> r;
  loop() {
    reactor::options ro;
    ro.entries = 128;
    ro.tick_ms = 5;
    r = reactor::create(ro);
    REQUIRE(r != nullptr);
  }
  // Runs until `done` or `ms` pass, driving `clients`' deadlines. Returns: done().
  template <class Done>
  bool until(Done done, const std::vector<redis_budget_store*>& stores, uint64_t ms = 5000) {
    const uint64_t end = sluice::monotonic_ms() + ms;
    while (!done()) {
      if (sluice::monotonic_ms() > end) return false;
      r->run_once(5);
      for (redis_budget_store* s : stores) s->on_iteration(r->now_ms());
    }
    return true;
  }
};

constexpr auto daily = budget_kind::daily_tokens;
constexpr auto monthly = budget_kind::monthly_tokens;

// One sluice process, as far as budgets go.
struct instance {
  std::shared_ptr<const cfg::config> c;
  std::unique_ptr<budget_board> board = std::make_unique<budget_board>(2, 4, 2);
  redis_budget_store* store = nullptr;
  std::unique_ptr<budget_ledger> ledger;

  instance(const redis_server& s, std::string id, int64_t now_ms, std::string_view text = k_config)
      : c(cfg::load(text, "budget_store_test.toml", cfg::flags{})) {
    auto st = std::make_unique<redis_budget_store>(options_for(s), std::move(id));
    store = st.get();
    ledger = std::make_unique<budget_ledger>(*board, std::move(st));
    std::string error;
    REQUIRE(ledger->load(*c, now_ms, error));
    ledger->step(*c, now_ms);
  }
  // Its connection on the shared loop, ready.
  void attach(loop& l) {
    store->attach(*l.r);
    REQUIRE(l.until([&] { return store->client() != nullptr && store->client()->connected(); }, {store}));
  }
  ~instance() {
    if (store != nullptr) store->detach();
  }
  instance(const instance&) = delete;
  instance& operator=(const instance&) = delete;

  // A shard settles `tokens` (and spend) for alice, in group g.
  void settle_alice(uint64_t tokens, uint64_t spend = 0) { board->count(0, 0, 0, tokens, spend); }
  // A period: step, then a push whose answer is waited for. Returns: kept.
  bool sync(int64_t now_ms) {
    ledger->step(*c, now_ms);
    const bool kept = ledger->save(now_ms, true);
    ledger->step(*c, now_ms);  // the answer's bits
    return kept;
  }
  uint64_t alice(budget_kind k, int64_t now_ms) const {
    return ledger->usage(subject_kind::key, "alice", windows_at(now_ms)).used[static_cast<size_t>(k)];
  }
  uint64_t alice_own(budget_kind k, int64_t now_ms) const {
    return ledger->own_usage(subject_kind::key, "alice", windows_at(now_ms)).used[static_cast<size_t>(k)];
  }
};

// Two instances on one fresh redis-server, connected, loaded at `t`.
// Members go in reverse: the instances (detached) before their loop.
struct two_instances {
  redis_server s;
  loop l;
  std::unique_ptr<instance> pa, pb;
  instance& a;
  instance& b;
  explicit two_instances(int64_t t)
      : pa(started(s) ? std::make_unique<instance>(s, "inst-a", t) : nullptr),
        pb(std::make_unique<instance>(s, "inst-b", t)),
        a(*pa),
        b(*pb) {
    a.attach(l);
    b.attach(l);
  }
  static bool started(redis_server& s) {
    REQUIRE(s.start());
    return true;
  }
};

// A process that used `tokens` of alice's budget at `t`, pushed them and
// ended (its field stays in Redis under its own id).
void earlier_process(redis_server& s, loop& l, std::string id, int64_t t, uint64_t tokens) {
  instance a(s, std::move(id), t);
  a.attach(l);
  a.settle_alice(tokens);
  REQUIRE(a.sync(t + 100));
  CHECK(a.alice(daily, t + 100) == tokens);
}

std::string field(redis_server& s, const std::string& key, const std::string& f) {
  redisReply* r = s.command({"HGET", key, f});
  std::string out = r != nullptr && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : "";
  if (r != nullptr) freeReplyObject(r);
  return out;
}

std::string day_key(int64_t now_ms, std::string_view subject = "key", std::string_view name = "alice") {
  return fmt::format("t:budget:day:{}:{}:{}", windows_at(now_ms).day, subject, name);
}
std::string month_key(int64_t now_ms, std::string_view subject = "key", std::string_view name = "alice") {
  return fmt::format("t:budget:month:{}:{}:{}", windows_at(now_ms).month, subject, name);
}

}  // namespace

TEST_SUITE("cluster::budget script") {
  TEST_CASE("own fields are only raised; the answer is every instance's sums") {
    redis_server s;
    REQUIRE(s.start());
    loop l;
    auto made = redis_client::create(*l.r, options_for(s));
    REQUIRE(made.ok());
    std::unique_ptr<redis_client> c = std::move(made.value());
    c->start();
    REQUIRE(l.until([&] { return c->connected(); }, {}));
    std::optional<result<std::vector<budget_sums>>> got;
    auto call = [&](std::string_view inst, uint64_t tokens, uint64_t spend) {
      got.reset();
      const std::vector<budget_counter> hashes = {{"t:budget:day:1:key:k", tokens, spend, 4'102'444'800'000},
                                                  {"t:budget:day:1:key:other", 0, 0, 4'102'444'800'000}};
      REQUIRE(c->budget(hashes, inst, [&](result<std::vector<budget_sums>> r) { got = std::move(r); }));
      REQUIRE(l.until([&] { return got.has_value(); }, {}));
      REQUIRE(got->ok());
      REQUIRE(got->value().size() == 2);
      return got->value();
    };
    CHECK(call("a", 10, 7) == std::vector<budget_sums>{{10, 7}, {0, 0}});
    CHECK(call("b", 5, 0) == std::vector<budget_sums>{{15, 7}, {0, 0}});
    // A repeated push, and a late one carrying less: nothing moves.
    CHECK(call("a", 10, 7) == std::vector<budget_sums>{{15, 7}, {0, 0}});
    CHECK(call("a", 3, 1) == std::vector<budget_sums>{{15, 7}, {0, 0}});
    CHECK(call("a", 12, 7) == std::vector<budget_sums>{{17, 7}, {0, 0}});
    CHECK(field(s, "t:budget:day:1:key:k", "t:a") == "12");
    CHECK(s.integer({"PEXPIRETIME", "t:budget:day:1:key:k"}) == 4'102'444'800'000);
    // A hash asked about with nothing to add is not created.
    CHECK(s.integer({"EXISTS", "t:budget:day:1:key:other"}) == 0);
    // Sums beyond 2^53 stay exact (64-bit, summed by the client).
    CHECK(call("c", 9'007'199'254'740'993ULL, 0)[0].tokens == 9'007'199'254'740'993ULL + 17);
    c.reset();
    for (int i = 0; i < 10; ++i) l.r->run_once(1);
  }
}

TEST_SUITE("cluster::redis_budget_store") {
  TEST_CASE("two instances sharing one redis see each other's usage; the budget is refused on both") {
    int64_t t = at(k_year, 12, 1, 12);
    two_instances two(t);
    redis_server& s = two.s;
    loop& l = two.l;
    instance& a = two.a;
    instance& b = two.b;
    a.settle_alice(30, to_nano(0.1));
    REQUIRE(a.sync(t += 100));
    REQUIRE(b.sync(t += 100));
    CHECK(b.alice(daily, t) == 30);
    CHECK(b.alice_own(daily, t) == 0);
    CHECK(b.ledger->usage(subject_kind::key, "alice", windows_at(t)).used[2] == to_nano(0.1));
    CHECK(b.ledger->usage(subject_kind::group, "g", windows_at(t)).used[0] == 30);
    CHECK(b.board->key_left(0, daily) == 20);
    CHECK(b.board->key_exhausted(0) == 0);
    b.settle_alice(25);
    REQUIRE(b.sync(t += 100));
    CHECK(b.alice(daily, t) == 55);
    CHECK(b.board->key_exhausted(0) == 1);  // daily_tokens
    REQUIRE(a.sync(t += 100));
    CHECK(a.alice(daily, t) == 55);
    CHECK(a.alice(monthly, t) == 55);
    CHECK(a.alice_own(daily, t) == 30);
    CHECK(a.board->key_exhausted(0) == 1);
    CHECK(a.board->key_left(0, daily) == 0);
    // Each instance's own field, the sum nowhere but in the answer.
    CHECK(field(s, day_key(t), "t:inst-a") == "30");
    CHECK(field(s, day_key(t), "t:inst-b") == "25");
    CHECK(field(s, month_key(t), "t:inst-b") == "25");
    CHECK(field(s, day_key(t, "group", "g"), "t:inst-a") == "30");
    // The hashes go some days after their windows end.
    CHECK(s.integer({"PEXPIRETIME", day_key(t)}) == day_end_ms(windows_at(t).day) + redis_budget_store::k_expiry_margin_ms);
    CHECK(s.integer({"PEXPIRETIME", month_key(t)}) ==
          month_end_ms(windows_at(t).month) + redis_budget_store::k_expiry_margin_ms);

    SUBCASE("the periodic pushes (a shared store pushes unchanged usage too) count nothing twice") {
      for (int i = 0; i < 5; ++i) {
        REQUIRE(a.sync(t += 100));
        REQUIRE(b.sync(t += 100));
      }
      CHECK(a.alice(daily, t) == 55);
      CHECK(b.alice(daily, t) == 55);
      CHECK(field(s, day_key(t), "t:inst-a") == "30");
    }
    SUBCASE("the non-forced path: a push every period, its answer taken on a later step") {
      b.settle_alice(5);
      const uint64_t before = b.store->client()->stats().commands;
      for (int i = 0; i < 20 && a.alice(daily, t) != 60; ++i) {
        t += 50;
        b.ledger->step(*b.c, t);
        b.ledger->save(t);
        a.ledger->step(*a.c, t);
        a.ledger->save(t);
        l.until([&] { return false; }, {a.store, b.store}, 10);
      }
      CHECK(a.alice(daily, t) == 60);
      CHECK(b.store->client()->stats().commands > before);
    }
  }

  TEST_CASE("a restarted process loads everyone's usage as the rest; its own starts at 0") {
    redis_server s;
    REQUIRE(s.start());
    loop l;
    const int64_t t = at(k_year, 12, 1, 12);
    earlier_process(s, l, "inst-a:1", t, 60);
    // The next process: a new instance id, loaded before its shards run.
    instance a2(s, "inst-a:2", t + 1000);
    CHECK(a2.alice(daily, t + 1000) == 60);
    CHECK(a2.alice_own(daily, t + 1000) == 0);
    CHECK(a2.board->key_exhausted(0) == 1);  // refused from the first request
    a2.attach(l);
    a2.settle_alice(5);
    REQUIRE(a2.sync(t + 1100));
    CHECK(a2.alice(daily, t + 1100) == 65);
    CHECK(field(s, day_key(t), "t:inst-a:1") == "60");
    CHECK(field(s, day_key(t), "t:inst-a:2") == "5");
  }

  TEST_CASE("the first of a month: day and month start at 0 on every instance; the old hashes stay as they were") {
    const int64_t t0 = at(k_year, 11, 30, 23, 59, 59, 800);
    two_instances two(t0);
    redis_server& s = two.s;
    instance& a = two.a;
    instance& b = two.b;
    a.settle_alice(40);
    REQUIRE(a.sync(t0));
    REQUIRE(b.sync(t0 + 100));
    CHECK(b.alice(monthly, t0 + 100) == 40);
    const int64_t t1 = at(k_year, 12, 1, 0, 0, 0, 100);
    REQUIRE(b.sync(t1));
    CHECK(b.alice(daily, t1) == 0);
    CHECK(b.alice(monthly, t1) == 0);
    CHECK(b.board->key_left(0, daily) == 50);
    a.settle_alice(7);
    REQUIRE(a.sync(t1 + 100));
    REQUIRE(b.sync(t1 + 200));
    CHECK(b.alice(daily, t1 + 200) == 7);
    CHECK(b.alice(monthly, t1 + 200) == 7);
    CHECK(field(s, day_key(t0), "t:inst-a") == "40");
    CHECK(field(s, month_key(t0), "t:inst-a") == "40");
    CHECK(field(s, day_key(t1), "t:inst-a") == "7");
    CHECK(field(s, month_key(t1), "t:inst-a") == "7");
  }

  TEST_CASE("a new day within the month: daily usage starts at 0 on every instance, monthly keeps counting") {
    const int64_t t0 = at(k_year, 12, 14, 23, 59, 59, 900);
    two_instances two(t0);
    instance& a = two.a;
    instance& b = two.b;
    a.settle_alice(50);
    REQUIRE(a.sync(t0));
    REQUIRE(b.sync(t0 + 50));
    CHECK(b.board->key_exhausted(0) == 1);
    const int64_t t1 = at(k_year, 12, 15, 0, 0, 0, 50);
    REQUIRE(b.sync(t1));
    CHECK(b.board->key_exhausted(0) == 0);
    CHECK(b.alice(daily, t1) == 0);
    CHECK(b.alice(monthly, t1) == 50);
    b.settle_alice(71);
    REQUIRE(b.sync(t1 + 100));
    REQUIRE(a.sync(t1 + 200));
    CHECK(a.alice(daily, t1) == 71);
    CHECK(a.alice(monthly, t1) == 121);
    CHECK(a.board->key_exhausted(0) == 3);  // daily and monthly tokens
  }

  TEST_CASE("redis down: each instance enforces what it knew plus its own; back: nothing lost or counted twice") {
    int64_t t = at(k_year, 12, 1, 12);
    two_instances two(t);
    redis_server& s = two.s;
    loop& l = two.l;
    instance& a = two.a;
    instance& b = two.b;
    a.settle_alice(20);
    REQUIRE(a.sync(t += 100));
    REQUIRE(b.sync(t += 100));
    CHECK(b.alice(daily, t) == 20);

    SUBCASE("stopped (SIGSTOP): the push times out; the one after the restart carries it once") {
      s.pause();
      a.settle_alice(25);
      CHECK_FALSE(a.sync(t += 100));  // the answer does not come within timeout_ms
      CHECK(a.alice(daily, t) == 45);  // the local view goes on
      CHECK(a.board->key_exhausted(0) == 0);
      a.settle_alice(6);
      CHECK_FALSE(a.sync(t += 100));
      CHECK(a.board->key_exhausted(0) == 1);  // 51: refused on what it knows
      s.resume();
      REQUIRE(l.until([&] { return a.store->client()->connected() && b.store->client()->connected(); },
                      {a.store, b.store}));
      REQUIRE(a.sync(t += 100));
      REQUIRE(b.sync(t += 100));
      CHECK(b.alice(daily, t) == 51);
      CHECK(a.alice(daily, t) == 51);
      CHECK(field(s, day_key(t), "t:inst-a") == "51");
      CHECK(b.board->key_exhausted(0) == 1);
    }
    SUBCASE("killed and started again empty: the running instances' own totals come back") {
      s.stop();
      a.settle_alice(10);
      b.settle_alice(4);
      CHECK_FALSE(a.sync(t += 100));
      CHECK_FALSE(b.sync(t += 100));
      CHECK(a.alice(daily, t) == 30);
      CHECK(b.alice(daily, t) == 24);  // 20 known from a, 4 of its own
      REQUIRE(s.start());
      REQUIRE(l.until([&] { return a.store->client()->connected() && b.store->client()->connected(); },
                      {a.store, b.store}));
      REQUIRE(a.sync(t += 100));
      REQUIRE(b.sync(t += 100));
      REQUIRE(a.sync(t += 100));
      CHECK(a.alice(daily, t) == 34);
      CHECK(b.alice(daily, t) == 34);
    }
  }

  TEST_CASE("redis unreachable at start: the load gives up within its bound; the first push brings the rest") {
    redis_server s;
    REQUIRE(s.start());
    loop l;
    const int64_t t = at(k_year, 12, 1, 12);
    earlier_process(s, l, "inst-a", t, 60);
    s.pause();
    const uint64_t started = sluice::monotonic_ms();
    instance b(s, "inst-b", t + 200);
    // connect_timeout_ms (= timeout_ms for the load) + timeout_ms, and margins.
    CHECK(sluice::monotonic_ms() - started < 1000);
    CHECK(b.alice(daily, t + 200) == 0);
    s.resume();
    b.attach(l);
    REQUIRE(b.sync(t + 300));
    CHECK(b.alice(daily, t + 300) == 60);
    CHECK(b.board->key_exhausted(0) == 1);
  }

  TEST_CASE("a hash holding someone else's data: the push fails (logged once), the view holds, and it recovers") {
    redis_server s;
    REQUIRE(s.start());
    loop l;
    int64_t t = at(k_year, 12, 1, 12);
    instance a(s, "inst-a", t);
    a.attach(l);
    redisReply* r = s.command({"SET", day_key(t), "not a hash"});
    REQUIRE(r != nullptr);
    freeReplyObject(r);
    a.settle_alice(12);
    CHECK_FALSE(a.sync(t += 100));
    CHECK_FALSE(a.sync(t += 100));
    CHECK(a.store->client()->connected());  // an error reply keeps the connection
    CHECK(a.alice(daily, t) == 12);
    CHECK(s.integer({"DEL", day_key(t)}) == 1);
    REQUIRE(a.sync(t += 100));
    CHECK(a.alice(daily, t) == 12);
    CHECK(field(s, day_key(t), "t:inst-a") == "12");
  }

  TEST_CASE("no budget in the config: nothing is loaded or pushed") {
    redis_server s;
    REQUIRE(s.start());
    loop l;
    const int64_t t = at(k_year, 12, 1, 12);
    instance a(s, "inst-a", t, "[[group]]\nname = \"g\"\nbackends = [\"http://127.0.0.1:9\"]\n[[key]]\nid = \"plain\"\nkey = \"sk-p\"\n");
    a.attach(l);
    a.board->count(0, 0, 0, 10, 0);
    CHECK(a.sync(t + 100));
    CHECK(a.store->client()->stats().commands == 0);
    CHECK(s.integer({"DBSIZE"}) == 0);
  }
}
