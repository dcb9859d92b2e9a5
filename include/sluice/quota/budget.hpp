#pragma once
// quota: budgets -- tokens and spend per UTC calendar day and month, per key
// and per group (README "Budgets"). Four parts:
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
//    file (budget_file_store), or with [cluster] Redis
//    (cluster::redis_budget_store): each instance pushes its own totals
//    there and gets every instance's back, asynchronously.
//
// Over-admission bound (README "Budgets"): admission only reads the bits,
// so a budget can be exceeded by (a) the requests in flight when it was
// crossed -- each pays all it uses, including streams cut short -- and (b)
// the requests admitted in the time the bits take to flip: up to one ledger
// period (50 ms) plus a shard's current loop turn. No request is admitted
// once the control thread has seen the usage that crossed the budget. With
// a shared store another instance's usage is seen one push later: (b)
// grows by the store's period plus a round trip (100 ms + RTT with Redis),
// on every instance; while the store is unreachable each instance enforces
// on what it last knew plus its own usage.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <mutex>
#include <condition_variable>
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

// What a push to a store came to.
enum class push_state : uint8_t {
  kept,       // the store has it (a shared store: and answered the totals)
  failed,     // nothing kept: the next push carries it all again
  in_flight,  // a shared store's answer is awaited (poll())
};

// Control thread. Where budgets live across restarts (and, with Redis,
// across instances). The ledger holds each subject's usage in two parts:
// its own (what this process charged since it started; only it pushes
// that) and the rest (what load() found -- earlier processes' -- and, with
// a shared store, the other instances' as of the last push's answer). What
// it enforces is their sum. Never a call on a shard thread; a local store's
// push blocks the control thread for its I/O, a shared store's does not.
class budget_store {
 public:
  virtual ~budget_store() = default;
  // At start, before the shards run: the usage kept before this process,
  // for the subjects of `cfg` (a local store returns all it has) at
  // `unix_ms`. Returns: false with `error` when the kept state is unusable
  // (the caller refuses to start); true with an empty state when nothing is
  // kept yet, or when a shared store cannot be reached in time (it logs
  // that; its first push that gets through brings the rest).
  virtual bool load(const config::config& cfg, int64_t unix_ms, budget_state& out, std::string& error) = 0;
  // `own`: this process's usage, every subject in the windows of `unix_ms`
  // (with a shared store also the subjects with a budget it has not
  // charged: their totals are what it asks for). `view`: own + the rest,
  // what the ledger enforces (built for a local store only; a shared store
  // gets an empty one). A local store keeps `view` and returns kept or
  // failed at once; a shared store keeps `own` under this instance's name
  // and returns in_flight (or failed when it cannot send now).
  virtual push_state push(const budget_state& own, const budget_state& view, int64_t unix_ms) = 0;
  // After a push returned in_flight, each step: in_flight while it is;
  // then, once, kept with `totals` = every instance's usage of the
  // subjects pushed (this one's own included, in the windows pushed), or
  // failed.
  virtual push_state poll(budget_state& totals) {
    (void)totals;
    return push_state::failed;
  }
  // Shutdown: poll() until the answer is in, for at most the store's own
  // timeout. Returns: what poll() last said (in_flight: no answer in time).
  virtual push_state wait(budget_state& totals) { return poll(totals); }
  // Shared with other instances: the ledger then pushes every period_ms(),
  // changed or not, to learn their usage.
  virtual bool shared() const noexcept { return false; }
  // The least time between two pushes.
  virtual uint32_t period_ms() const noexcept { return 1000; }
  virtual std::string_view describe() const = 0;  // for log lines
  // SIGUSR2: this process handed its listeners over; from now on its view
  // goes where the new process takes it (take_handover), not where that
  // one keeps its own. No-op for a shared store (each instance its field).
  virtual void hand_over() {}
  // The view an old process left at its hand-over, once, when there is
  // one. Returns: whether `out` holds it.
  virtual bool take_handover(budget_state& out) {
    (void)out;
    return false;
  }
};

// A JSON file, replaced atomically: a temp file in the same directory,
// fsync, rename over the old one, fsync of the directory. A missing file is
// "nothing kept"; an unreadable, corrupt or foreign one is refused by
// load() (the operator moves it away: usage is never silently reset). One
// process's: the view it keeps includes what it loaded.
//
// The write, its fsyncs and the rename run on a helper thread of the
// store's own (push() returns in_flight; poll() says how it went): a slow
// or stalled disk never holds the control thread, which serves /healthz,
// probes, lending and signals.
class budget_file_store final : public budget_store {
 public:
  explicit budget_file_store(std::string path) : _path(std::move(path)) {}
  ~budget_file_store() override;
  budget_file_store(const budget_file_store&) = delete;
  budget_file_store& operator=(const budget_file_store&) = delete;
  // The file's state (also --check-config's test of it).
  bool load(budget_state& out, std::string& error);
  bool load(const config::config& cfg, int64_t unix_ms, budget_state& out, std::string& error) override;
  push_state push(const budget_state& own, const budget_state& view, int64_t unix_ms) override;
  push_state poll(budget_state& totals) override;
  push_state wait(budget_state& totals) override;
  std::string_view describe() const override { return _path; }
  // The hand-over (SIGUSR2) goes through `<path>.handover`: the old
  // process, once it handed over, writes its view there (each period, and
  // last at its exit) instead of over the new one's file; the new one's
  // writer thread takes it (renamed away first, so no write of the old one
  // is lost between the read and the unlink) each time it wakes, at least
  // once a second, and the ledger keeps the larger of each count.
  void hand_over() override;
  bool take_handover(budget_state& out) override;

  // The write itself, on whatever thread calls it. Returns: kept or failed.
  push_state write_file(const std::string& text);

 private:
  void run_writer();
  // The writer thread: an old process's view, when one is there.
  void look_for_handover();

  std::string _path;
  bool _handed_over = false;   // under _mu: writes go to <path>.handover
  bool _has_handover = false;  // under _mu
  budget_state _handover;      // under _mu: what an old process left
  bool _warned = false;  // the writer thread's
  std::mutex _mu;
  std::condition_variable _cv;
  std::string _job;            // the next text to write (under _mu)
  bool _has_job = false;       // under _mu
  bool _stopping = false;      // under _mu
  push_state _result = push_state::kept;  // under _mu: the last write's
  bool _busy = false;          // under _mu: a job taken or waiting
  std::thread _writer;         // started by the first push
};

// Control thread, from start to shutdown. Turns the board's cumulative
// counters into windowed usage and publishes the exhausted bits.
class budget_ledger {
 public:
  budget_ledger(budget_board& board, std::unique_ptr<budget_store> store);

  // At start, before the shards run: the store's usage for `cfg`'s
  // subjects becomes the rest. Returns: false with `error` when the
  // store's state is refused.
  bool load(const config::config& cfg, int64_t unix_ms, std::string& error);
  // Every period: charges what the shards settled since the last step to
  // this process's own usage, rolls windows past `unix_ms`, and publishes
  // bits and amounts left (own + rest) for every key and group of `cfg`.
  // Cheap (a few loads and map look-ups per subject).
  void step(const config::config& cfg, int64_t unix_ms);
  // Before step(): takes a finished push's answer (a shared store's totals
  // become the rest), so that the step publishes it at once.
  void collect();
  // After step(): collect(), then starts the next push when one is due -- usage
  // changed since the last kept push, or the store is shared -- at most
  // every period_ms() of the store unless `force`, and only while the
  // config has a budget (a gateway without budgets writes nothing).
  // `force` (shutdown) also waits for a shared store's answer. Returns:
  // false when the last push that finished failed (it is carried again).
  bool save(int64_t unix_ms, bool force = false);
  // SIGUSR2: the process handed over; its view goes to the store's
  // hand-over place from the next save on, the first of them whatever
  // changed (budget_store::hand_over).
  void hand_over();

  // The usage of a subject, rolled to `now` (zeros when unknown): own + rest.
  budget_usage usage(subject_kind kind, std::string_view name, budget_windows now) const;
  // This process's own part of it.
  budget_usage own_usage(subject_kind kind, std::string_view name, budget_windows now) const;
  const budget_board& board() const noexcept { return _board; }
  // Charged since the last kept push.
  bool dirty() const noexcept { return _charges != _kept_charges; }
  bool pushing() const noexcept { return _in_flight; }
  const budget_store* store() const noexcept { return _store.get(); }

 private:
  budget_usage& own(subject_kind kind, std::string_view name);
  void finish(push_state st, budget_state& totals);
  budget_state view(budget_windows now) const;

  budget_board& _board;
  std::unique_ptr<budget_store> _store;
  budget_state _own;   // this process's charges, per subject in its windows
  budget_state _rest;  // everyone else's: loaded, then a shared store's answers (or an old process's hand-over)
  budget_state _sent;  // _own as the push in flight carried it
  // Cumulative sums at the last step, by board position.
  std::vector<uint64_t> _seen_key_tokens, _seen_key_spend, _seen_group_tokens;
  uint64_t _charges = 0;       // steps that charged something
  uint64_t _kept_charges = 0;  // ... as of the last kept push
  uint64_t _sent_charges = 0;  // ... as of the push in flight
  bool _handover_due = false;  // hand_over(): the next save writes, changed or not
  bool _in_flight = false;
  bool _last_ok = true;        // the last finished push was kept
  bool _any_budget = false;    // as of the last step's config
  int64_t _last_save_ms = 0;
};

}  // namespace sluice::quota
