#pragma once
// quota: budgets -- tokens and spend per UTC calendar day and month, per key
// and per group (README "Budgets", issue 17 §3). Four parts:
//
//  - the calendar: UTC windows of a wall-clock time given as a parameter
//    (never read inside), so rollover is a unit test, not a wait;
//  - budget_board: the memory the shards and the control thread share. Each
//    shard adds what it settled to its own cumulative counters (single
//    writer, a relaxed load and store: no locked instruction); the control
//    thread publishes per key and per group "exhausted" bits and the amounts
//    left, which a shard reads with one relaxed load at admission;
//  - budget_ledger: control thread only. Sums the shards' counters every
//    period (~50 ms), charges the difference since the last look to each
//    subject's current windows (by name, so a reload that moves a key keeps
//    its usage), compares to the budgets and publishes to the board;
//  - budget_store: where the ledger's usage lives across restarts. The local
//    file (budget_file_store) today; a Redis-backed store implements the
//    same two calls (load at start, push periodically) and returns every
//    instance's totals from push().
//
// Over-admission bound (README "Budgets"): admission only reads the bits,
// so a budget can be exceeded by (a) the requests in flight when it was
// crossed -- each pays all it uses, including streams cut short -- and (b)
// the requests admitted in the time the bits take to flip: up to one ledger
// period (50 ms) plus a shard's current loop turn. No request is admitted
// once the control thread has seen the usage that crossed the budget.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/config.hpp"

namespace sluice::quota {

// ---------------------------------------------------------------------------
// Calendar (UTC; proleptic Gregorian)

struct civil_date {
  int32_t year = 1970;
  uint32_t month = 1;  // 1..12
  uint32_t day = 1;    // 1..31
};
// Days since 1970-01-01 <-> a date.
int64_t days_from_civil(civil_date d) noexcept;
civil_date civil_from_days(int64_t days) noexcept;

// The windows a moment falls in: `day` counts days since 1970-01-01, `month`
// counts months since January of year 0 (year * 12 + month - 1).
struct budget_windows {
  int64_t day = 0;
  int64_t month = 0;
  bool operator==(const budget_windows&) const = default;
};
budget_windows windows_at(int64_t unix_ms) noexcept;
// Returns: the first millisecond after the window (when it resets).
int64_t day_end_ms(int64_t day) noexcept;
int64_t month_end_ms(int64_t month) noexcept;
// "2026-12-02T00:00:00Z" into out (at least k_utc_chars). Returns: length.
inline constexpr size_t k_utc_chars = 24;
size_t format_utc(int64_t unix_ms, char* out) noexcept;

// ---------------------------------------------------------------------------
// What a budget counts

// The four budgets of a key; a group has the two token ones. The order is
// the bit order of the board's exhausted bits and of the arrays below.
enum class budget_kind : uint8_t { daily_tokens = 0, monthly_tokens = 1, daily_spend = 2, monthly_spend = 3 };
inline constexpr size_t budget_kind_count = 4;
inline constexpr bool is_daily(budget_kind k) noexcept { return (static_cast<unsigned>(k) & 1u) == 0; }
inline constexpr bool is_spend(budget_kind k) noexcept { return static_cast<unsigned>(k) >= 2; }
std::string_view budget_name(budget_kind k) noexcept;  // "daily_tokens", ...

// Spend is counted in nano-units of the currency (1e-9), so shards add
// integers. Returns: the nano-units of `prompt` and `completion` tokens at
// the given costs per 1M tokens (rounded per request).
uint64_t spend_nano(uint64_t prompt, uint64_t completion, double input_cost_per_mtok,
                    double output_cost_per_mtok) noexcept;
inline uint64_t to_nano(double currency) noexcept {
  return currency <= 0 ? 0 : static_cast<uint64_t>(currency * 1e9 + 0.5);
}

// Budgets of one subject: tokens, or nano-units for spend; 0 = none.
using budget_limits = std::array<uint64_t, budget_kind_count>;
budget_limits limits_of(const config::key_config& k) noexcept;
budget_limits limits_of(const config::group_config& g) noexcept;

// One subject's usage in the windows it was last charged in.
struct budget_usage {
  budget_windows at{-1, -1};
  std::array<uint64_t, budget_kind_count> used{};  // by budget_kind

  // Starts the windows that `now` is past at 0 (a usage of an older window
  // is over). Returns: whether anything changed.
  bool roll(budget_windows now) noexcept;
  // roll(now), then charges both windows.
  void add(budget_windows now, uint64_t tokens, uint64_t spend_nano) noexcept;
};

// ---------------------------------------------------------------------------
// The shared board

// Process-wide. Made before the shards start, freed after they are joined;
// sized for the reload room (config::capacity_for), so a reload never moves
// a cell. Indices are config positions (config.keys, config.groups).
class budget_board {
 public:
  // Rejections are counted per key and reason: its own four budgets, then
  // its group's two.
  static constexpr size_t k_reasons = budget_kind_count + 2;

  budget_board(uint32_t shards, uint32_t keys_max, uint32_t groups_max);

  uint32_t shard_count() const noexcept { return _shards; }
  uint32_t keys_max() const noexcept { return _keys; }
  uint32_t groups_max() const noexcept { return _groups; }

  // Shard `s` only (the single writer of its cells), at settlement. `group`
  // may be out of range (no group resolved): only the key is charged.
  void count(uint32_t s, uint32_t key, uint32_t group, uint64_t tokens, uint64_t spend_nano) noexcept {
    if (key < _keys) {
      bump(cell(s, key * 2), tokens);
      bump(cell(s, key * 2 + 1), spend_nano);
    }
    if (group < _groups) bump(cell(s, _keys * 2 + group), tokens);
  }
  void count_rejection(uint32_t s, uint32_t key, size_t reason) noexcept {
    if (key < _keys && reason < k_reasons) bump(cell(s, _keys * 2 + _groups + key * k_reasons + reason), 1);
  }

  // Any shard, at admission: bits (1 << budget_kind) of the budgets used up,
  // as of the control thread's last period. One relaxed load.
  uint8_t key_exhausted(uint32_t key) const noexcept {
    return key < _keys ? _flags[key].load(std::memory_order_relaxed) : 0;
  }
  uint8_t group_exhausted(uint32_t group) const noexcept {
    return group < _groups ? _flags[_keys + group].load(std::memory_order_relaxed) : 0;
  }
  // Left of a budget as last published (for headers); 0 when none is set.
  uint64_t key_left(uint32_t key, budget_kind k) const noexcept {
    return key < _keys ? _left[key * budget_kind_count + static_cast<size_t>(k)].load(std::memory_order_relaxed) : 0;
  }
  uint64_t group_left(uint32_t group, budget_kind k) const noexcept {
    return group < _groups ? _left[(_keys + group) * budget_kind_count + static_cast<size_t>(k)].load(std::memory_order_relaxed)
                           : 0;
  }

  // Control thread: sums over the shards (cumulative since the start).
  uint64_t key_tokens(uint32_t key) const noexcept { return sum(key * 2); }
  uint64_t key_spend_nano(uint32_t key) const noexcept { return sum(key * 2 + 1); }
  uint64_t group_tokens(uint32_t group) const noexcept { return sum(_keys * 2 + group); }
  uint64_t rejections(uint32_t key, size_t reason) const noexcept {
    return sum(_keys * 2 + _groups + key * k_reasons + reason);
  }
  // Control thread: the single writer of flags and amounts left.
  void publish_key(uint32_t key, uint8_t exhausted, const budget_limits& left) noexcept;
  void publish_group(uint32_t group, uint8_t exhausted, const budget_limits& left) noexcept;

 private:
  // A shard's cells start on their own cache line: no line is written by
  // two cores.
  struct alignas(64) line {
    std::atomic<uint64_t> v[8];
  };
  std::atomic<uint64_t>& cell(uint32_t s, size_t i) noexcept { return _lines[s * _lines_per_shard + i / 8].v[i % 8]; }
  const std::atomic<uint64_t>& cell(uint32_t s, size_t i) const noexcept {
    return _lines[s * _lines_per_shard + i / 8].v[i % 8];
  }
  // Single writer: load + store, not fetch_add (no lock prefix on x86).
  static void bump(std::atomic<uint64_t>& c, uint64_t by) noexcept {
    c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }
  uint64_t sum(size_t i) const noexcept;

  uint32_t _shards, _keys, _groups;
  size_t _lines_per_shard;
  std::vector<line> _lines;                         // [shard][cells]
  std::unique_ptr<std::atomic<uint8_t>[]> _flags;   // [keys + groups]
  std::unique_ptr<std::atomic<uint64_t>[]> _left;   // [(keys + groups) * budget_kind_count]
};

// ---------------------------------------------------------------------------
// Kept usage, and where it is kept

enum class subject_kind : uint8_t { key, group };

// Every subject's usage by name: what a store loads and keeps.
struct budget_state {
  std::map<std::string, budget_usage, std::less<>> keys;
  std::map<std::string, budget_usage, std::less<>> groups;
};

// JSON text of a state, and back. parse_state returns false with `error`
// (naming what is wrong) on text that is not a sluice budget state.
std::string format_state(const budget_state& s, int64_t now_ms);
bool parse_state(std::string_view text, budget_state& out, std::string& error);

// Control thread. Where budgets live across restarts (and, with Redis,
// across instances). Called about once a second while usage changed, and at
// shutdown; a call may block the control thread for its I/O, never a shard.
class budget_store {
 public:
  virtual ~budget_store() = default;
  // At start. Returns: false with `error` when the kept state is unusable
  // (the caller refuses to start); a store with nothing kept yet returns
  // true and an empty state.
  virtual bool load(budget_state& out, std::string& error) = 0;
  // `delta`: what this process charged since the last successful push (per
  // subject, in its windows); `whole`: this process's view of every
  // subject. A local store keeps `whole`; a shared one adds `delta` to the
  // shared counters and puts every instance's totals into `merged` (the
  // ledger takes them as its view). Returns: false when nothing was kept
  // (the delta is pushed again next time).
  virtual bool push(const budget_state& delta, const budget_state& whole, int64_t unix_ms, budget_state* merged) = 0;
  virtual std::string_view describe() const = 0;  // for log lines
};

// A JSON file, replaced atomically: a temp file in the same directory,
// fsync, rename over the old one, fsync of the directory. A missing file is
// "nothing kept"; an unreadable, corrupt or foreign one is refused by
// load() (the operator moves it away: usage is never silently reset).
class budget_file_store final : public budget_store {
 public:
  explicit budget_file_store(std::string path) : _path(std::move(path)) {}
  bool load(budget_state& out, std::string& error) override;
  bool push(const budget_state& delta, const budget_state& whole, int64_t unix_ms, budget_state* merged) override;
  std::string_view describe() const override { return _path; }

 private:
  std::string _path;
  bool _warned = false;
};

// Control thread, from start to shutdown. Turns the board's cumulative
// counters into windowed usage and publishes the exhausted bits.
class budget_ledger {
 public:
  budget_ledger(budget_board& board, std::unique_ptr<budget_store> store);

  // At start, before the shards run. Returns: false with `error` when the
  // store's state is refused.
  bool load(std::string& error);
  // Every period: charges what the shards settled since the last step,
  // rolls windows past `unix_ms`, and publishes bits and amounts left for
  // every key and group of `cfg`. Cheap (a few loads per subject).
  void step(const config::config& cfg, int64_t unix_ms);
  // Pushes to the store when usage changed since the last push, at most
  // once a second unless `force` (shutdown), and only while the config has
  // a budget (a gateway without budgets writes no file). Returns: whether
  // the store kept it (or nothing was to keep).
  bool save(int64_t unix_ms, bool force = false);

  // The usage of a subject, rolled to `now` (zeros when unknown).
  budget_usage usage(subject_kind kind, std::string_view name, budget_windows now) const;
  const budget_board& board() const noexcept { return _board; }
  bool dirty() const noexcept { return _dirty; }

 private:
  budget_usage& at(subject_kind kind, std::string_view name);
  budget_board& _board;
  std::unique_ptr<budget_store> _store;
  budget_state _state;
  budget_state _delta;  // charged since the last successful push
  // Cumulative sums at the last step, by board position.
  std::vector<uint64_t> _seen_key_tokens, _seen_key_spend, _seen_group_tokens;
  bool _dirty = false;
  bool _any_budget = false;  // as of the last step's config
  int64_t _last_save_ms = 0;
};

}  // namespace sluice::quota
