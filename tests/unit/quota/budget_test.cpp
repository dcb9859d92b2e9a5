// Budgets: the UTC calendar, window rollover, the board, the ledger and the
// state file. Time is always a parameter.
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "sluice/config/config.hpp"
#include "sluice/quota/budget.hpp"

using namespace sluice::quota;
namespace cfg = sluice::config;

namespace {

// Unix ms of a UTC date and time.
int64_t at(int32_t y, uint32_t m, uint32_t d, int64_t hh = 0, int64_t mm = 0, int64_t ss = 0, int64_t ms = 0) {
  return days_from_civil({y, m, d}) * 86'400'000 + ((hh * 60 + mm) * 60 + ss) * 1000 + ms;
}

std::string utc(int64_t ms) {
  char b[k_utc_chars];
  return std::string(b, format_utc(ms, b));
}

// A state file in a fresh temp directory, removed at the end.
struct temp_dir {
  std::string path;
  temp_dir() {
    char t[] = "/tmp/sluice-budget-test-XXXXXX";
    REQUIRE(::mkdtemp(t) != nullptr);
    path = t;
  }
  ~temp_dir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

std::string read_text(const std::string& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::shared_ptr<const cfg::config> config_with(std::string_view keys_and_groups) {
  std::string text = "[quota]\nbudget_state_file = \"\"\n";
  text += keys_and_groups;
  return cfg::load(text, "budget_test.toml", cfg::flags{});
}

constexpr std::string_view k_two = R"(
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

// A shared store in memory (what cluster::redis_budget_store is to Redis,
// without windows: every test here stays in one): each instance's own
// totals by key id, raised by its pushes, summed when the answer comes.
struct fake_world {
  std::map<std::string, std::map<std::string, std::array<uint64_t, budget_kind_count>>> own;  // instance -> key -> used
};

class fake_shared_store final : public budget_store {
 public:
  fake_shared_store(fake_world& w, std::string me) : _w(w), _me(std::move(me)) {}
  bool load(const cfg::config&, int64_t unix_ms, budget_state& out, std::string&) override {
    out = sums({"alice"}, windows_at(unix_ms));
    return true;
  }
  push_state push(const budget_state& own, const budget_state&, int64_t) override {
    if (!up) return push_state::failed;
    _asked.clear();
    for (const auto& [name, u] : own.keys) {
      auto& mine = _w.own[_me][name];
      for (size_t k = 0; k < budget_kind_count; ++k) mine[k] = std::max(mine[k], u.used[k]);
      _asked.push_back(name);
      _at = u.at;
    }
    _pending = true;
    return push_state::in_flight;
  }
  push_state poll(budget_state& totals) override {
    if (_pending && !answer_now) return push_state::in_flight;
    if (!_pending) return push_state::failed;
    _pending = false;
    totals = sums(_asked, _at);
    return push_state::kept;
  }
  bool shared() const noexcept override { return true; }
  uint32_t period_ms() const noexcept override { return 100; }
  std::string_view describe() const override { return "fake"; }

  bool up = true;
  bool answer_now = false;  // the answer has come (poll() takes it)

 private:
  budget_state sums(const std::vector<std::string>& names, budget_windows at) const {
    budget_state s;
    for (const std::string& n : names) {
      budget_usage& u = s.keys[n];
      u.at = at;
      for (const auto& [inst, keys] : _w.own) {
        if (auto it = keys.find(n); it != keys.end()) {
          for (size_t k = 0; k < budget_kind_count; ++k) u.used[k] += it->second[k];
        }
      }
    }
    return s;
  }
  fake_world& _w;
  std::string _me;
  std::vector<std::string> _asked;
  budget_windows _at;
  bool _pending = false;
};

}  // namespace

TEST_SUITE("quota::budget calendar") {
  TEST_CASE("days and dates round-trip across eras, leap days and the epoch") {
    CHECK(days_from_civil({1970, 1, 1}) == 0);
    CHECK(days_from_civil({2000, 3, 1}) - days_from_civil({2000, 2, 28}) == 2);  // 2000 is a leap year
    CHECK(days_from_civil({1900, 3, 1}) - days_from_civil({1900, 2, 28}) == 1);  // 1900 is not
    CHECK(days_from_civil({2024, 3, 1}) - days_from_civil({2024, 2, 28}) == 2);
    CHECK(days_from_civil({2026, 3, 1}) - days_from_civil({2026, 2, 28}) == 1);
    for (int64_t d = -800'000; d <= 800'000; d += 997) {
      const civil_date c = civil_from_days(d);
      CHECK(days_from_civil(c) == d);
    }
    const civil_date leap = civil_from_days(days_from_civil({2028, 2, 29}));
    CHECK((leap.year == 2028 && leap.month == 2 && leap.day == 29));
  }

  TEST_CASE("a day ends at UTC midnight; a month at the first of the next, leap February included") {
    const budget_windows w = windows_at(at(2026, 12, 1, 23, 59, 59, 999));
    CHECK(utc(day_end_ms(w.day)) == "2026-12-02T00:00:00Z");
    CHECK(utc(month_end_ms(w.month)) == "2027-01-01T00:00:00Z");  // across the year
    CHECK(windows_at(at(2026, 12, 2)).day == w.day + 1);
    CHECK(windows_at(at(2026, 12, 2)).month == w.month);
    CHECK(utc(month_end_ms(windows_at(at(2028, 2, 10)).month)) == "2028-03-01T00:00:00Z");
    CHECK(windows_at(at(2028, 2, 29, 23, 59, 59)).month == windows_at(at(2028, 2, 1)).month);
    CHECK(windows_at(at(2028, 3, 1)).month == windows_at(at(2028, 2, 1)).month + 1);
    CHECK(utc(at(2026, 7, 4, 13, 5, 9)) == "2026-07-04T13:05:09Z");
    CHECK(windows_at(-1).day == -1);  // before the epoch rounds down, not toward 0
  }
}

TEST_SUITE("quota::budget usage") {
  TEST_CASE("usage rolls over at midnight (day only) and at the month's start (both)") {
    budget_usage u;
    u.add(windows_at(at(2026, 1, 31, 10)), 30, 7);
    u.add(windows_at(at(2026, 1, 31, 23, 59, 59, 999)), 5, 0);
    CHECK(u.used == std::array<uint64_t, 4>{35, 35, 7, 7});
    SUBCASE("the next day, same month") {
      budget_usage v = u;
      v.add(windows_at(at(2026, 1, 30 + 1, 23, 59)), 0, 0);  // still the 31st: nothing rolls
      CHECK(v.used[0] == 35);
      budget_usage w;
      w.add(windows_at(at(2026, 1, 30)), 10, 0);
      w.add(windows_at(at(2026, 1, 31)), 1, 0);
      CHECK(w.used == std::array<uint64_t, 4>{1, 11, 0, 0});
    }
    SUBCASE("the first of the next month starts both at 0") {
      CHECK(u.roll(windows_at(at(2026, 2, 1))));
      CHECK(u.used == std::array<uint64_t, 4>{0, 0, 0, 0});
      CHECK_FALSE(u.roll(windows_at(at(2026, 2, 1, 12))));
    }
    SUBCASE("a clock stepped back keeps what was counted") {
      CHECK_FALSE(u.roll(windows_at(at(2026, 1, 30))));
      CHECK(u.used[0] == 35);
    }
  }

  TEST_CASE("spend is counted in nano-units at the costs per 1M tokens") {
    CHECK(spend_nano(1'000'000, 0, 2.5, 10) == 2'500'000'000);
    CHECK(spend_nano(9, 10, 1000, 3000) == 39'000'000);  // 0.009 + 0.030
    CHECK(spend_nano(0, 0, 5, 5) == 0);
    CHECK(to_nano(0.05) == 50'000'000);
  }
}

TEST_SUITE("quota::budget ledger") {
  TEST_CASE("the ledger sums every shard's counters, publishes the bits at the budget and what is left") {
    auto c = config_with(k_two);
    budget_board board(2, 4, 2);
    budget_ledger ledger(board, nullptr);
    const int64_t t0 = at(2026, 12, 1, 12);
    ledger.step(*c, t0);
    CHECK(board.key_exhausted(0) == 0);
    CHECK(board.key_left(0, budget_kind::daily_tokens) == 50);
    CHECK(board.key_left(1, budget_kind::daily_tokens) == 0);  // no budget: nothing published
    board.count(0, 0, 0, 30, spend_nano(10, 20, 1000, 2000));
    board.count(1, 0, 0, 19, 0);
    ledger.step(*c, t0 + 50);
    CHECK(board.key_exhausted(0) == 0);
    CHECK(board.key_left(0, budget_kind::daily_tokens) == 1);
    CHECK(board.group_left(0, budget_kind::daily_tokens) == 51);
    board.count(1, 0, 0, 1, 0);
    ledger.step(*c, t0 + 100);
    CHECK(board.key_exhausted(0) == (1u << 0));
    CHECK(board.group_exhausted(0) == 0);
    board.count(0, 1, 0, 60, 0);  // bob, no budget of his own, fills the group
    ledger.step(*c, t0 + 150);
    CHECK(board.key_exhausted(1) == 0);
    CHECK(board.group_exhausted(0) == (1u << 0));
    CHECK(ledger.usage(subject_kind::group, "g", windows_at(t0)).used[0] == 110);
    SUBCASE("midnight clears the daily bits; the monthly usage stays") {
      ledger.step(*c, at(2026, 12, 2));
      CHECK(board.key_exhausted(0) == 0);
      CHECK(board.group_exhausted(0) == 0);
      CHECK(board.key_left(0, budget_kind::daily_tokens) == 50);
      CHECK(board.key_left(0, budget_kind::monthly_tokens) == 70);
      board.count(0, 0, 0, 70, 0);
      ledger.step(*c, at(2026, 12, 2, 0, 0, 1));
      CHECK(board.key_exhausted(0) == ((1u << 0) | (1u << 1)));
    }
    SUBCASE("the spend budget at the group's costs") {
      board.count(0, 0, 0, 0, to_nano(0.5));
      ledger.step(*c, t0 + 200);
      CHECK((board.key_exhausted(0) & (1u << 2)) != 0);
      CHECK(board.key_left(0, budget_kind::daily_spend) == 0);
    }
  }

  TEST_CASE("a restart in the same window keeps the usage; in the next window it starts at 0") {
    temp_dir d;
    const std::string file = d.file("budgets.json");
    auto c = config_with(k_two);
    const int64_t t0 = at(2026, 12, 31, 23, 0);
    {
      budget_board board(1, 4, 2);
      budget_ledger ledger(board, std::make_unique<budget_file_store>(file));
      std::string error;
      REQUIRE(ledger.load(*c, t0, error));
      board.count(0, 0, 0, 60, 0);
      ledger.step(*c, t0);
      CHECK(ledger.save(t0, true));
      CHECK_FALSE(ledger.dirty());
    }
    const std::string text = read_text(file);
    CHECK(text.find("\"format\": \"sluice-budgets\"") != std::string::npos);
    CHECK(text.find("\"alice\": {\"day\": \"2026-12-31\", \"month\": \"2026-12\", \"daily_tokens\": 60") != std::string::npos);
    auto restart = [&](int64_t now) {
      auto board = std::make_unique<budget_board>(1, 4, 2);
      budget_ledger ledger(*board, std::make_unique<budget_file_store>(file));
      std::string error;
      REQUIRE(ledger.load(*c, now, error));
      ledger.step(*c, now);
      return std::pair{ledger.usage(subject_kind::key, "alice", windows_at(now)), board->key_exhausted(0)};
    };
    SUBCASE("same day") {
      auto [u, bits] = restart(t0 + 60'000);
      CHECK(u.used[0] == 60);
      CHECK(u.used[1] == 60);
      CHECK(bits == 1);  // refused from the first request on
    }
    SUBCASE("the next day is the next month and the next year: all at 0") {
      auto [u, bits] = restart(at(2027, 1, 1, 0, 0, 1));
      CHECK(u.used == std::array<uint64_t, 4>{0, 0, 0, 0});
      CHECK(bits == 0);
    }
  }

  TEST_CASE("SIGUSR2: the old process's view after its hand-over reaches the new one, never over its file") {
    temp_dir d;
    const std::string file = d.file("budgets.json");
    const int64_t t0 = at(2026, 12, 5, 12, 0);
    budget_state totals;
    auto state_of = [&](uint64_t tokens) {
      budget_state s;
      s.keys["k"].add(windows_at(t0), tokens, 0);
      return s;
    };
    budget_file_store old_store(file);
    REQUIRE(old_store.push({}, state_of(5), t0) == push_state::in_flight);
    REQUIRE(old_store.wait(totals) == push_state::kept);
    // The new process loads 5, then the old one hands over and settles 4 more.
    budget_file_store new_store(file);
    budget_state loaded;
    std::string error;
    REQUIRE(new_store.load(loaded, error));
    CHECK(loaded.keys.at("k").used[0] == 5);
    old_store.hand_over();
    REQUIRE(old_store.push({}, state_of(9), t0 + 1000) == push_state::in_flight);
    REQUIRE(old_store.wait(totals) == push_state::kept);
    budget_file_store reader(file);
    budget_state main_file;
    REQUIRE(reader.load(main_file, error));
    CHECK(main_file.keys.at("k").used[0] == 5);  // not written over: the new process's file
    // The new store's writer takes it within its look (once a second).
    budget_state left;
    bool took = false;
    for (int i = 0; i < 500 && !took; ++i) {
      took = new_store.take_handover(left);
      if (!took) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(took);
    CHECK(left.keys.at("k").used[0] == 9);
    CHECK(::access((file + ".handover").c_str(), F_OK) != 0);
    CHECK(::access((file + ".handover.taken").c_str(), F_OK) != 0);
    CHECK_FALSE(new_store.take_handover(left));  // once
  }

  TEST_CASE("a ledger keeps the larger of what it loaded and an old process's hand-over") {
    temp_dir d;
    const std::string file = d.file("budgets.json");
    auto c = config_with(k_two);
    const int64_t t0 = at(2026, 12, 5, 12, 0);
    {
      budget_board board(1, 4, 2);
      budget_ledger ledger(board, std::make_unique<budget_file_store>(file));
      std::string error;
      REQUIRE(ledger.load(*c, t0, error));
      board.count(0, 0, 0, 60, 0);
      ledger.step(*c, t0);
      CHECK(ledger.save(t0, true));
    }
    budget_board board(1, 4, 2);
    budget_ledger ledger(board, std::make_unique<budget_file_store>(file));
    std::string error;
    REQUIRE(ledger.load(*c, t0, error));
    ledger.step(*c, t0);
    CHECK(ledger.usage(subject_kind::key, "alice", windows_at(t0)).used[0] == 60);
    {
      // The old process, handed over, settles 25 more and exits.
      budget_board old_board(1, 4, 2);
      budget_ledger old(old_board, std::make_unique<budget_file_store>(file));
      REQUIRE(old.load(*c, t0, error));
      old.hand_over();
      old_board.count(0, 0, 0, 25, 0);
      old.step(*c, t0 + 10);
      CHECK(old.save(t0 + 10, true));
    }
    for (int i = 0; i < 500 && ledger.usage(subject_kind::key, "alice", windows_at(t0)).used[0] != 85; ++i) {
      ledger.collect();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(ledger.usage(subject_kind::key, "alice", windows_at(t0)).used[0] == 85);
    board.count(0, 0, 0, 5, 0);  // and its own go on top
    ledger.step(*c, t0 + 20);
    CHECK(ledger.usage(subject_kind::key, "alice", windows_at(t0)).used[0] == 90);
  }

  TEST_CASE("a file store with nothing kept starts empty; no budget in the config writes no file") {
    temp_dir d;
    const std::string file = d.file("none.json");
    auto c = config_with("[[group]]\nname = \"g\"\nbackends = [\"http://127.0.0.1:9\"]\n[[key]]\nid = \"plain\"\nkey = \"sk-p\"\n");
    budget_board board(1, 2, 1);
    budget_ledger ledger(board, std::make_unique<budget_file_store>(file));
    std::string error;
    REQUIRE(ledger.load(*c, at(2026, 5, 5), error));
    board.count(0, 0, 0, 10, 0);
    ledger.step(*c, at(2026, 5, 5));
    CHECK(ledger.save(at(2026, 5, 5), true));
    CHECK(::access(file.c_str(), F_OK) != 0);
  }

  TEST_CASE("a usage charged at an old position (a key moved by a reload) goes to the key's id") {
    auto c = config_with(k_two);
    budget_board board(1, 4, 2);
    budget_ledger ledger(board, nullptr);
    board.count(0, 0, 0, 5, 0);
    ledger.step(*c, at(2026, 6, 1));
    CHECK(ledger.usage(subject_kind::key, "alice", windows_at(at(2026, 6, 1))).used[0] == 5);
  }
}

TEST_SUITE("quota::budget ledger with a shared store") {
  TEST_CASE("the rest is the answer's totals less what was sent; what is charged while a push is out counts at once") {
    auto c = config_with(k_two);
    const int64_t t0 = at(2026, 12, 1, 12);
    fake_world w;
    w.own["b"]["alice"] = {20, 20, 0, 0};
    budget_board board(1, 4, 2);
    auto owned = std::make_unique<fake_shared_store>(w, "a");
    fake_shared_store& store = *owned;
    budget_ledger ledger(board, std::move(owned));
    std::string error;
    REQUIRE(ledger.load(*c, t0, error));
    ledger.step(*c, t0);
    auto alice = [&] { return ledger.usage(subject_kind::key, "alice", windows_at(t0)).used[0]; };
    CHECK(alice() == 20);
    CHECK(ledger.own_usage(subject_kind::key, "alice", windows_at(t0)).used[0] == 0);

    board.count(0, 0, 0, 10, 0);
    ledger.step(*c, t0 + 50);
    CHECK(ledger.save(t0 + 200));  // sends own = 10
    CHECK(ledger.pushing());
    board.count(0, 0, 0, 5, 0);
    ledger.step(*c, t0 + 250);
    CHECK(alice() == 35);  // 20 known of b + 15 of its own
    w.own["b"]["alice"][0] = 27;  // b goes on meanwhile
    ledger.collect();
    CHECK(ledger.pushing());  // no answer yet: nothing changes
    store.answer_now = true;
    ledger.collect();
    CHECK_FALSE(ledger.pushing());
    ledger.step(*c, t0 + 300);
    CHECK(alice() == 42);  // (10 + 27) - 10 sent = 27 of b, + 15 own
    CHECK(board.key_exhausted(0) == 0);
    CHECK(ledger.dirty());  // the 5 charged after the send

    SUBCASE("the next push carries the whole own total; the bits flip on the others' usage") {
      w.own["b"]["alice"][0] = 40;
      CHECK(ledger.save(t0 + 400));
      ledger.collect();
      ledger.step(*c, t0 + 450);
      CHECK(alice() == 55);
      CHECK(w.own["a"]["alice"][0] == 15);
      CHECK(board.key_exhausted(0) == 1);
      CHECK_FALSE(ledger.dirty());
    }
    SUBCASE("pushes too soon after the last wait their period; a store that cannot send keeps it all") {
      store.answer_now = false;
      CHECK(ledger.save(t0 + 350));  // 150 ms after the last push: due
      CHECK(ledger.pushing());
      store.answer_now = true;
      ledger.collect();
      store.up = false;
      board.count(0, 0, 0, 3, 0);
      ledger.step(*c, t0 + 400);
      CHECK(ledger.save(t0 + 400));  // 50 ms: not due, nothing tried
      CHECK_FALSE(ledger.save(t0 + 500));  // due, failed
      CHECK(alice() == 45);  // 27 + 18 own
      store.up = true;
      CHECK(ledger.save(t0 + 600, true));  // shutdown: waited for
      CHECK(w.own["a"]["alice"][0] == 18);
      CHECK_FALSE(ledger.dirty());
    }
  }
}

TEST_SUITE("quota::budget state file") {
  TEST_CASE("a state round-trips through its JSON") {
    budget_state s;
    s.keys["alice"].add(windows_at(at(2026, 2, 28)), 7, 9);
    s.groups["g/1"].add(windows_at(at(2026, 2, 28)), 3, 0);
    budget_state back;
    std::string error;
    REQUIRE(parse_state(format_state(s, at(2026, 2, 28)), back, error));
    CHECK(back.keys.at("alice").used == s.keys.at("alice").used);
    CHECK(back.keys.at("alice").at == s.keys.at("alice").at);
    CHECK(back.groups.at("g/1").used[0] == 3);
  }

  TEST_CASE("corrupt or foreign text is refused with what is wrong") {
    struct bad {
      const char* text;
      const char* says;
    };
    const bad cases[] = {
        {"", "not JSON"},
        {"{\"keys\": {}, \"groups\": {}}", "not a sluice budget state"},
        {"{\"format\": \"sluice-budgets\", \"version\": 2, \"keys\": {}, \"groups\": {}}", "another version"},
        {"{\"format\": \"sluice-budgets\", \"version\": 1, \"keys\": {}}", "\"groups\" is missing"},
        {"{\"format\": \"sluice-budgets\", \"version\": 1, \"keys\": {\"a\": {\"day\": \"2026-13-01\", \"month\": "
         "\"2026-12\", \"daily_tokens\": 1, \"monthly_tokens\": 1, \"daily_spend_nano\": 0, \"monthly_spend_nano\": 0}}, "
         "\"groups\": {}}",
         "key \"a\": \"day\" must be"},
        {"{\"format\": \"sluice-budgets\", \"version\": 1, \"keys\": {\"a\": {\"day\": \"2026-12-01\", \"month\": "
         "\"2026-12\", \"daily_tokens\": -1, \"monthly_tokens\": 1, \"daily_spend_nano\": 0, \"monthly_spend_nano\": 0}}, "
         "\"groups\": {}}",
         "\"daily_tokens\" must be a whole number"},
        {"{\"format\": \"sluice-budgets\", \"version\": 1, \"keys\": {\"a\": {\"day\": \"2026-12-01\", \"month\": "
         "\"2026-12\", \"daily_tokens\": 1, \"monthly_tokens\": 1, \"daily_spend_nano\": 0, \"monthly_spend_nano\": 0}",
         "not JSON"},
    };
    for (const bad& b : cases) {
      CAPTURE(b.text);
      budget_state s;
      std::string error;
      CHECK_FALSE(parse_state(b.text, s, error));
      CHECK(error.find(b.says) != std::string::npos);
    }
  }

  TEST_CASE("the file store refuses a corrupt file, naming it, and leaves no temp file after a save") {
    temp_dir d;
    const std::string file = d.file("b.json");
    {
      std::ofstream(file) << "garbage";
    }
    budget_file_store store(file);
    budget_state s;
    std::string error;
    CHECK_FALSE(store.load(s, error));
    CHECK(error.find(file) != std::string::npos);
    CHECK(error.find("move it away") != std::string::npos);
    budget_state whole;
    whole.keys["k"].add(windows_at(at(2026, 1, 1)), 1, 0);
    // Written on the store's own thread: push hands it over, wait (or
    // poll, each period) says how it went.
    CHECK(store.push({}, whole, at(2026, 1, 1)) == push_state::in_flight);
    budget_state totals;
    CHECK(store.wait(totals) == push_state::kept);
    CHECK(store.poll(totals) == push_state::kept);
    CHECK(store.load(s, error));
    CHECK(s.keys.at("k").used[0] == 1);
    CHECK(::access((file + ".tmp").c_str(), F_OK) != 0);
  }
}
