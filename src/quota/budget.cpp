// Budgets: the UTC calendar, the board the shards count on, the ledger the
// control thread keeps, and the state file (sluice/quota/budget.hpp).
#include "sluice/quota/budget.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstring>

#include <simdjson.h>

#include "sluice/core/log.hpp"

namespace sluice::quota {

namespace {

constexpr int64_t k_day_ms = 86'400'000;

int64_t floor_div(int64_t a, int64_t b) noexcept { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

}  // namespace

// Days <-> dates by counting 400-year eras of 146097 days, with years
// starting on 1 March so that the leap day is the last day of a year.
int64_t days_from_civil(civil_date d) noexcept {
  const int64_t y = static_cast<int64_t>(d.year) - (d.month <= 2 ? 1 : 0);
  const int64_t era = floor_div(y, 400);
  const int64_t year_of_era = y - era * 400;                               // 0..399
  const int64_t month_from_march = (static_cast<int64_t>(d.month) + 9) % 12;  // March = 0
  const int64_t day_of_year = (153 * month_from_march + 2) / 5 + static_cast<int64_t>(d.day) - 1;
  const int64_t day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
  return era * 146097 + day_of_era - 719468;  // 719468: days from 0000-03-01 to 1970-01-01
}

civil_date civil_from_days(int64_t days) noexcept {
  const int64_t z = days + 719468;
  const int64_t era = floor_div(z, 146097);
  const int64_t day_of_era = z - era * 146097;  // 0..146096
  const int64_t year_of_era =
      (day_of_era - day_of_era / 1460 + day_of_era / 36524 - day_of_era / 146096) / 365;
  const int64_t day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
  const int64_t month_from_march = (5 * day_of_year + 2) / 153;
  civil_date out;
  out.day = static_cast<uint32_t>(day_of_year - (153 * month_from_march + 2) / 5 + 1);
  out.month = static_cast<uint32_t>(month_from_march < 10 ? month_from_march + 3 : month_from_march - 9);
  out.year = static_cast<int32_t>(year_of_era + era * 400 + (out.month <= 2 ? 1 : 0));
  return out;
}

budget_windows windows_at(int64_t unix_ms) noexcept {
  budget_windows w;
  w.day = floor_div(unix_ms, k_day_ms);
  const civil_date d = civil_from_days(w.day);
  w.month = static_cast<int64_t>(d.year) * 12 + d.month - 1;
  return w;
}

int64_t day_end_ms(int64_t day) noexcept { return (day + 1) * k_day_ms; }

int64_t month_end_ms(int64_t month) noexcept {
  const int64_t next = month + 1;
  civil_date d;
  d.year = static_cast<int32_t>(floor_div(next, 12));
  d.month = static_cast<uint32_t>(next - floor_div(next, 12) * 12 + 1);
  d.day = 1;
  return days_from_civil(d) * k_day_ms;
}

size_t format_utc(int64_t unix_ms, char* out) noexcept {
  const int64_t day = floor_div(unix_ms, k_day_ms);
  const int64_t s = (unix_ms - day * k_day_ms) / 1000;
  const civil_date d = civil_from_days(day);
  auto r = fmt::format_to_n(out, k_utc_chars, "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", d.year, d.month, d.day, s / 3600,
                            s / 60 % 60, s % 60);
  return r.size < k_utc_chars ? r.size : k_utc_chars;
}

std::string_view budget_name(budget_kind k) noexcept {
  switch (k) {
    case budget_kind::daily_tokens: return "daily_tokens";
    case budget_kind::monthly_tokens: return "monthly_tokens";
    case budget_kind::daily_spend: return "daily_spend";
    case budget_kind::monthly_spend: return "monthly_spend";
  }
  return "?";
}

uint64_t spend_nano(uint64_t prompt, uint64_t completion, double input_cost_per_mtok,
                    double output_cost_per_mtok) noexcept {
  // A cost per 1M tokens is 1e9 / 1e6 = 1e3 nano-units per token.
  const double nano = (static_cast<double>(prompt) * input_cost_per_mtok +
                       static_cast<double>(completion) * output_cost_per_mtok) * 1e3;
  return nano <= 0 ? 0 : static_cast<uint64_t>(nano + 0.5);
}

budget_limits limits_of(const config::key_config& k) noexcept {
  return {k.daily_tokens, k.monthly_tokens, to_nano(k.daily_spend), to_nano(k.monthly_spend)};
}

budget_limits limits_of(const config::group_config& g) noexcept { return {g.daily_tokens, g.monthly_tokens, 0, 0}; }

bool budget_usage::roll(budget_windows now) noexcept {
  bool changed = false;
  // Only forward: a wall clock stepped back keeps what was counted.
  if (now.day > at.day) {
    changed = at.day >= 0 && (used[0] | used[2]) != 0;
    used[static_cast<size_t>(budget_kind::daily_tokens)] = 0;
    used[static_cast<size_t>(budget_kind::daily_spend)] = 0;
    at.day = now.day;
  }
  if (now.month > at.month) {
    changed = changed || (at.month >= 0 && (used[1] | used[3]) != 0);
    used[static_cast<size_t>(budget_kind::monthly_tokens)] = 0;
    used[static_cast<size_t>(budget_kind::monthly_spend)] = 0;
    at.month = now.month;
  }
  return changed;
}

void budget_usage::add(budget_windows now, uint64_t tokens, uint64_t spend) noexcept {
  roll(now);
  used[0] += tokens;
  used[1] += tokens;
  used[2] += spend;
  used[3] += spend;
}

// ---------------------------------------------------------------------------
// budget_board

budget_board::budget_board(uint32_t shards, uint32_t keys_max, uint32_t groups_max)
    : _shards(shards == 0 ? 1 : shards),
      _keys(keys_max),
      _groups(groups_max),
      _lines_per_shard((static_cast<size_t>(keys_max) * 2 + groups_max + static_cast<size_t>(keys_max) * k_reasons + 7) / 8),
      _lines(static_cast<size_t>(_shards) * (_lines_per_shard == 0 ? 1 : _lines_per_shard)),
      _flags(std::make_unique<std::atomic<uint8_t>[]>(static_cast<size_t>(keys_max) + groups_max + 1)),
      _left(std::make_unique<std::atomic<uint64_t>[]>((static_cast<size_t>(keys_max) + groups_max + 1) * budget_kind_count)) {
  if (_lines_per_shard == 0) _lines_per_shard = 1;
}

uint64_t budget_board::sum(size_t i) const noexcept {
  uint64_t total = 0;
  for (uint32_t s = 0; s < _shards; ++s) total += cell(s, i).load(std::memory_order_relaxed);
  return total;
}

void budget_board::publish_key(uint32_t key, uint8_t exhausted, const budget_limits& left) noexcept {
  if (key >= _keys) return;
  for (size_t k = 0; k < budget_kind_count; ++k) _left[key * budget_kind_count + k].store(left[k], std::memory_order_relaxed);
  _flags[key].store(exhausted, std::memory_order_relaxed);
}

void budget_board::publish_group(uint32_t group, uint8_t exhausted, const budget_limits& left) noexcept {
  if (group >= _groups) return;
  const size_t row = static_cast<size_t>(_keys) + group;
  for (size_t k = 0; k < budget_kind_count; ++k) _left[row * budget_kind_count + k].store(left[k], std::memory_order_relaxed);
  _flags[row].store(exhausted, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------
// The state's JSON

namespace {

constexpr std::string_view k_format = "sluice-budgets";

void put_subjects(std::string& out, const std::map<std::string, budget_usage, std::less<>>& m) {
  bool first = true;
  for (const auto& [name, u] : m) {
    const civil_date d = civil_from_days(u.at.day < 0 ? 0 : u.at.day);
    const int64_t month = u.at.month < 0 ? 1970 * 12 : u.at.month;
    // Names are config ids (plain characters, README "Configuration"):
    // nothing in them needs escaping.
    fmt::format_to(std::back_inserter(out),
                   "{}\n    \"{}\": {{\"day\": \"{:04}-{:02}-{:02}\", \"month\": \"{:04}-{:02}\", \"daily_tokens\": {}, "
                   "\"monthly_tokens\": {}, \"daily_spend_nano\": {}, \"monthly_spend_nano\": {}}}",
                   first ? "" : ",", name, d.year, d.month, d.day, month / 12, month % 12 + 1, u.used[0], u.used[1],
                   u.used[2], u.used[3]);
    first = false;
  }
}

// "YYYY-MM-DD" / "YYYY-MM". Returns: false on anything else.
bool parse_day(std::string_view s, int64_t& day) {
  unsigned y = 0, m = 0, d = 0;
  if (s.size() != 10 || s[4] != '-' || s[7] != '-') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9}) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  y = static_cast<unsigned>((s[0] - '0') * 1000 + (s[1] - '0') * 100 + (s[2] - '0') * 10 + (s[3] - '0'));
  m = static_cast<unsigned>((s[5] - '0') * 10 + (s[6] - '0'));
  d = static_cast<unsigned>((s[8] - '0') * 10 + (s[9] - '0'));
  if (m < 1 || m > 12 || d < 1 || d > 31) return false;
  day = days_from_civil({static_cast<int32_t>(y), m, d});
  return true;
}

bool parse_month(std::string_view s, int64_t& month) {
  if (s.size() != 7 || s[4] != '-') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6}) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  const int64_t y = (s[0] - '0') * 1000 + (s[1] - '0') * 100 + (s[2] - '0') * 10 + (s[3] - '0');
  const int64_t m = (s[5] - '0') * 10 + (s[6] - '0');
  if (m < 1 || m > 12) return false;
  month = y * 12 + m - 1;
  return true;
}

bool parse_subjects(simdjson::dom::element e, std::string_view what,
                    std::map<std::string, budget_usage, std::less<>>& out, std::string& error) {
  simdjson::dom::object subjects;
  if (e.get_object().get(subjects) != simdjson::SUCCESS) {
    error = fmt::format("\"{}\" is not an object", what);
    return false;
  }
  static constexpr std::string_view k_fields[] = {"daily_tokens", "monthly_tokens", "daily_spend_nano",
                                                  "monthly_spend_nano"};
  for (auto [name, value] : subjects) {
    budget_usage u;
    std::string_view day, month;
    if (value["day"].get_string().get(day) != simdjson::SUCCESS || !parse_day(day, u.at.day) ||
        value["month"].get_string().get(month) != simdjson::SUCCESS || !parse_month(month, u.at.month)) {
      error = fmt::format("{} \"{}\": \"day\" must be \"YYYY-MM-DD\" and \"month\" \"YYYY-MM\"", what, name);
      return false;
    }
    for (size_t i = 0; i < budget_kind_count; ++i) {
      if (value[k_fields[i]].get_uint64().get(u.used[i]) != simdjson::SUCCESS) {
        error = fmt::format("{} \"{}\": \"{}\" must be a whole number >= 0", what, name, k_fields[i]);
        return false;
      }
    }
    out.emplace(std::string(name), u);
  }
  return true;
}

}  // namespace

std::string format_state(const budget_state& s, int64_t now_ms) {
  char saved[k_utc_chars];
  const size_t sl = format_utc(now_ms, saved);
  std::string out;
  out.reserve(256 + (s.keys.size() + s.groups.size()) * 200);
  fmt::format_to(std::back_inserter(out), "{{\n  \"format\": \"{}\",\n  \"version\": 1,\n  \"saved_at\": \"{}\",\n  \"keys\": {{",
                 k_format, std::string_view(saved, sl));
  put_subjects(out, s.keys);
  out += "\n  },\n  \"groups\": {";
  put_subjects(out, s.groups);
  out += "\n  }\n}\n";
  return out;
}

bool parse_state(std::string_view text, budget_state& out, std::string& error) {
  simdjson::dom::parser parser;
  const simdjson::padded_string padded(text);
  simdjson::dom::element root;
  if (auto e = parser.parse(padded).get(root); e != simdjson::SUCCESS) {
    error = fmt::format("not JSON ({})", simdjson::error_message(e));
    return false;
  }
  std::string_view format;
  uint64_t version = 0;
  if (root["format"].get_string().get(format) != simdjson::SUCCESS || format != k_format) {
    error = fmt::format("not a sluice budget state (no \"format\": \"{}\")", k_format);
    return false;
  }
  if (root["version"].get_uint64().get(version) != simdjson::SUCCESS || version != 1) {
    error = "a budget state of another version (this sluice reads version 1)";
    return false;
  }
  budget_state s;
  simdjson::dom::element keys, groups;
  if (root["keys"].get(keys) != simdjson::SUCCESS || root["groups"].get(groups) != simdjson::SUCCESS) {
    error = "\"keys\" or \"groups\" is missing";
    return false;
  }
  if (!parse_subjects(keys, "key", s.keys, error) || !parse_subjects(groups, "group", s.groups, error)) return false;
  out = std::move(s);
  return true;
}

// ---------------------------------------------------------------------------
// budget_file_store

bool budget_file_store::load(budget_state& out, std::string& error) {
  out = {};
  const int fd = ::open(_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return true;
    error = fmt::format("budget state file {}: {}", _path, std::strerror(errno));
    return false;
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = fmt::format("budget state file {}: {}", _path, std::strerror(errno));
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  std::string why;
  if (!parse_state(text, out, why)) {
    error = fmt::format("budget state file {}: {}; refusing to start rather than forget what was used "
                        "(restore it, or move it away to start every budget at 0)",
                        _path, why);
    return false;
  }
  return true;
}

namespace {

bool write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    const ssize_t n = ::write(fd, s.data(), s.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    s.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

bool budget_file_store::load(const config::config&, int64_t, budget_state& out, std::string& error) {
  return load(out, error);
}

void budget_file_store::hand_over() {
  const std::lock_guard lock(_mu);
  _handed_over = true;
}

bool budget_file_store::take_handover(budget_state& out) {
  std::unique_lock lock(_mu, std::try_to_lock);  // never waits for a write in progress
  if (!lock.owns_lock()) return false;
  if (!_writer.joinable() && !_handed_over) {
    // The writer looks for a hand-over once a second even before this
    // process has anything of its own to write.
    try {
      _writer = std::thread([this] { run_writer(); });
    } catch (...) {
      return false;  // no thread: the first push tries again
    }
  }
  if (!_has_handover) return false;
  out = std::move(_handover);
  _handover = {};
  _has_handover = false;
  return true;
}

void budget_file_store::look_for_handover() {
  // Claimed by a rename first: the old process may write a newer one at
  // any moment, which then waits for the next look instead of being
  // unlinked unread.
  const std::string from = _path + ".handover";
  const std::string taken = _path + ".handover.taken";
  if (::rename(from.c_str(), taken.c_str()) != 0) return;  // none (ENOENT), or not ours to take
  budget_file_store reader(taken);
  budget_state s;
  std::string error;
  const bool ok = reader.load(s, error);
  (void)::unlink(taken.c_str());
  if (!ok) {
    log::warn("budget state file: the hand-over {} was unreadable ({}); the old process's last usage is in the audit log",
              from, error);
    return;
  }
  // Two before the ledger took the first: the later is a later view of
  // the same process, so it replaces it.
  const std::lock_guard lock(_mu);
  _handover = std::move(s);
  _has_handover = true;
}

push_state budget_file_store::push(const budget_state&, const budget_state& whole, int64_t unix_ms) {
  std::string text = format_state(whole, unix_ms);
  std::unique_lock lock(_mu);
  if (_busy) return push_state::failed;  // the last write is still out: this one waits for the next period
  if (!_writer.joinable()) {
    try {
      _writer = std::thread([this] { run_writer(); });
    } catch (...) {
      lock.unlock();
      return write_file(text);  // no thread to be had: written here, as before
    }
  }
  _job = std::move(text);
  _has_job = _busy = true;
  lock.unlock();
  _cv.notify_one();
  return push_state::in_flight;
}

push_state budget_file_store::poll(budget_state&) {
  const std::lock_guard lock(_mu);
  return _busy ? push_state::in_flight : _result;
}

push_state budget_file_store::wait(budget_state&) {
  // Shutdown: the last write finishes (a disk that never answers holds the
  // exit, as any fsync would).
  std::unique_lock lock(_mu);
  _cv.wait(lock, [this] { return !_busy; });
  return _result;
}

budget_file_store::~budget_file_store() {
  {
    const std::lock_guard lock(_mu);
    _stopping = true;
  }
  _cv.notify_all();
  if (_writer.joinable()) _writer.join();
}

void budget_file_store::run_writer() {
  std::unique_lock lock(_mu);
  for (;;) {
    // Woken by a job, or once a second to look for an old process's
    // hand-over (a new process may have nothing of its own to write).
    _cv.wait_for(lock, std::chrono::seconds(1), [this] { return _has_job || _stopping; });
    if (_stopping && !_has_job) return;
    const bool handed_over = _handed_over;
    lock.unlock();
    if (!handed_over) look_for_handover();
    lock.lock();
    if (!_has_job) continue;
    std::string text = std::move(_job);
    _has_job = false;
    lock.unlock();
    const push_state st = write_file(text);
    lock.lock();
    _result = st;
    _busy = false;
    _cv.notify_all();
  }
}

push_state budget_file_store::write_file(const std::string& text) {
  // The new state goes to a temp file next to the old one, reaches the disk,
  // and only then replaces it (rename is atomic within a directory); the
  // directory's fsync makes the rename itself survive a crash. Handed over,
  // to <path>.handover (the new process keeps <path>).
  bool handed_over = false;
  {
    const std::lock_guard lock(_mu);
    handed_over = _handed_over;
  }
  const std::string target = handed_over ? _path + ".handover" : _path;
  const std::string tmp = target + ".tmp";
  const size_t slash = _path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : _path.substr(0, slash);
  const char* step = "open";
  bool ok = false;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    step = "write";
    if (write_all(fd, text)) {
      step = "fsync";
      if (::fsync(fd) == 0) ok = true;
    }
    ::close(fd);
  }
  if (ok) {
    step = "rename";
    ok = ::rename(tmp.c_str(), target.c_str()) == 0;
  }
  if (ok) {
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);  // best effort: the file itself is complete either way
      ::close(dfd);
    }
  }
  if (!ok) {
    const int err = errno;
    if (fd >= 0 || step != std::string_view("open")) (void)::unlink(tmp.c_str());
    if (!_warned) log::warn("budget state file {}: {} failed: {}; kept in memory, retried every second", _path, step,
                            std::strerror(err));
    _warned = true;
    return push_state::failed;
  }
  if (_warned) log::info("budget state file {}: written again", _path);
  _warned = false;
  return push_state::kept;
}

// ---------------------------------------------------------------------------
// budget_ledger

namespace {

// a + b in the later of their windows (a part of an older window is over).
budget_usage combined(budget_usage a, budget_usage b, budget_windows now) noexcept {
  a.roll(now);
  b.roll(now);
  a.roll(b.at);
  b.roll(a.at);
  for (size_t k = 0; k < budget_kind_count; ++k) a.used[k] += b.used[k];
  return a;
}

const budget_usage* find(const budget_state& s, subject_kind kind, std::string_view name) {
  const auto& m = kind == subject_kind::key ? s.keys : s.groups;
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

// Bits of the budgets used up, and what is left of each (0 where none).
uint8_t exhausted_of(const budget_limits& limits, const budget_usage& u, budget_limits& left) noexcept {
  uint8_t bits = 0;
  for (size_t k = 0; k < budget_kind_count; ++k) {
    left[k] = limits[k] == 0 ? 0 : limits[k] > u.used[k] ? limits[k] - u.used[k] : 0;
    if (limits[k] != 0 && u.used[k] >= limits[k]) bits = static_cast<uint8_t>(bits | (1u << k));
  }
  return bits;
}

bool any(const budget_limits& l) noexcept { return (l[0] | l[1] | l[2] | l[3]) != 0; }

}  // namespace

budget_ledger::budget_ledger(budget_board& board, std::unique_ptr<budget_store> store)
    : _board(board),
      _store(std::move(store)),
      _seen_key_tokens(board.keys_max(), 0),
      _seen_key_spend(board.keys_max(), 0),
      _seen_group_tokens(board.groups_max(), 0) {}

bool budget_ledger::load(const config::config& cfg, int64_t unix_ms, std::string& error) {
  if (!_store) return true;
  return _store->load(cfg, unix_ms, _rest, error);
}

budget_usage& budget_ledger::own(subject_kind kind, std::string_view name) {
  auto& m = kind == subject_kind::key ? _own.keys : _own.groups;
  auto it = m.find(name);
  if (it == m.end()) it = m.emplace(std::string(name), budget_usage{}).first;
  return it->second;
}

budget_usage budget_ledger::usage(subject_kind kind, std::string_view name, budget_windows now) const {
  const budget_usage* o = find(_own, kind, name);
  const budget_usage* r = find(_rest, kind, name);
  return combined(o != nullptr ? *o : budget_usage{}, r != nullptr ? *r : budget_usage{}, now);
}

budget_usage budget_ledger::own_usage(subject_kind kind, std::string_view name, budget_windows now) const {
  const budget_usage* o = find(_own, kind, name);
  budget_usage u = o != nullptr ? *o : budget_usage{};
  u.roll(now);
  return u;
}

void budget_ledger::step(const config::config& cfg, int64_t unix_ms) {
  const budget_windows now = windows_at(unix_ms);
  const size_t keys = std::min<size_t>(cfg.keys.size(), _board.keys_max());
  const size_t groups = std::min<size_t>(cfg.groups.size(), _board.groups_max());
  bool charged = false;
  // What the shards settled since the last step. A removed key (a reload)
  // still finishes its in-flight requests on its old position: charged to
  // its id like the new one.
  for (uint32_t k = 0; k < keys; ++k) {
    const uint64_t t = _board.key_tokens(k), s = _board.key_spend_nano(k);
    if (t == _seen_key_tokens[k] && s == _seen_key_spend[k]) continue;
    const uint64_t dt = t - _seen_key_tokens[k], ds = s - _seen_key_spend[k];
    _seen_key_tokens[k] = t;
    _seen_key_spend[k] = s;
    own(subject_kind::key, cfg.keys[k].id).add(now, dt, ds);
    charged = true;
  }
  for (uint32_t g = 0; g < groups; ++g) {
    const uint64_t t = _board.group_tokens(g);
    if (t == _seen_group_tokens[g]) continue;
    const uint64_t dt = t - _seen_group_tokens[g];
    _seen_group_tokens[g] = t;
    own(subject_kind::group, cfg.groups[g].name).add(now, dt, 0);
    charged = true;
  }
  if (charged) ++_charges;
  // A shared store is asked for every subject with a budget, charged here
  // or not: the others' usage is what flips its bits.
  const bool shared = _store != nullptr && _store->shared();
  // Publish: only subjects with a budget look anything up.
  _any_budget = false;
  auto publish = [&](subject_kind kind, uint32_t i, const std::string& name, const budget_limits& limits) {
    budget_limits left{};
    uint8_t bits = 0;
    if (any(limits)) {
      _any_budget = true;
      if (shared) (void)own(kind, name);
      bits = exhausted_of(limits, usage(kind, name, now), left);
    }
    if (kind == subject_kind::key) {
      _board.publish_key(i, bits, left);
    } else {
      _board.publish_group(i, bits, left);
    }
  };
  for (uint32_t k = 0; k < keys; ++k) publish(subject_kind::key, k, cfg.keys[k].id, limits_of(cfg.keys[k]));
  for (uint32_t g = 0; g < groups; ++g) publish(subject_kind::group, g, cfg.groups[g].name, limits_of(cfg.groups[g]));
}

budget_state budget_ledger::view(budget_windows now) const {
  budget_state v;
  for (subject_kind kind : {subject_kind::key, subject_kind::group}) {
    auto& out = kind == subject_kind::key ? v.keys : v.groups;
    for (const budget_state* part : {&_own, &_rest}) {
      for (const auto& [name, u] : kind == subject_kind::key ? part->keys : part->groups) {
        if (out.find(name) == out.end()) out.emplace(name, usage(kind, name, now));
      }
    }
  }
  return v;
}

void budget_ledger::finish(push_state st, budget_state& totals) {
  _in_flight = false;
  _last_ok = st == push_state::kept;
  if (!_last_ok) return;
  _kept_charges = _sent_charges;
  // Every instance's totals, this one's own as sent included: the rest is
  // the difference, in the windows sent (own only grows within a window,
  // so what Redis holds of it is exactly what was sent).
  for (subject_kind kind : {subject_kind::key, subject_kind::group}) {
    auto& rest = kind == subject_kind::key ? _rest.keys : _rest.groups;
    for (auto& [name, total] : kind == subject_kind::key ? totals.keys : totals.groups) {
      const budget_usage* sent = find(_sent, kind, name);
      budget_usage others = total;
      for (size_t k = 0; sent != nullptr && k < budget_kind_count; ++k) {
        others.used[k] = total.used[k] > sent->used[k] ? total.used[k] - sent->used[k] : 0;
      }
      rest[name] = others;
    }
  }
}

namespace {

// The larger of two counts of one subject, in the later of their windows
// (an old process's hand-over and what this one loaded: both views of the
// same usage, one later than the other).
budget_usage larger(budget_usage a, budget_usage b) noexcept {
  a.roll(b.at);
  b.roll(a.at);
  for (size_t k = 0; k < budget_kind_count; ++k) a.used[k] = a.used[k] > b.used[k] ? a.used[k] : b.used[k];
  return a;
}

}  // namespace

void budget_ledger::collect() {
  if (!_store) return;
  budget_state left;
  if (_any_budget && _store->take_handover(left)) {
    // The old process's view at its hand-over includes what this one
    // loaded from it and what it charged since: the rest becomes the larger.
    for (auto kind : {subject_kind::key, subject_kind::group}) {
      auto& rest = kind == subject_kind::key ? _rest.keys : _rest.groups;
      for (const auto& [name, u] : kind == subject_kind::key ? left.keys : left.groups) {
        auto it = rest.find(name);
        if (it == rest.end()) {
          rest.emplace(name, u);
        } else {
          it->second = larger(it->second, u);
        }
      }
    }
  }
  if (!_in_flight) return;
  budget_state totals;
  const push_state st = _store->poll(totals);
  if (st != push_state::in_flight) finish(st, totals);
}

void budget_ledger::hand_over() {
  if (!_store) return;
  _store->hand_over();
  _handover_due = true;
}

bool budget_ledger::save(int64_t unix_ms, bool force) {
  if (!_store) return true;
  budget_state totals;
  if (_in_flight) {
    const push_state st = force ? _store->wait(totals) : _store->poll(totals);
    if (st == push_state::in_flight && !force) return _last_ok;
    finish(st == push_state::in_flight ? push_state::failed : st, totals);
  }
  if (!_any_budget) return true;
  if (!dirty() && !_store->shared() && !_handover_due) return _last_ok;
  if (!force && unix_ms - _last_save_ms < static_cast<int64_t>(_store->period_ms())) return _last_ok;
  _last_save_ms = unix_ms;
  const budget_windows now = windows_at(unix_ms);
  for (auto* m : {&_own.keys, &_own.groups}) {
    for (auto& [name, u] : *m) u.roll(now);
  }
  _sent = _own;
  _sent_charges = _charges;
  _handover_due = false;
  totals = {};
  push_state st = _store->push(_own, _store->shared() ? budget_state{} : view(now), unix_ms);
  if (st == push_state::in_flight) {
    _in_flight = true;
    if (!force) return _last_ok;
    st = _store->wait(totals);
    if (st == push_state::in_flight) st = push_state::failed;
  }
  finish(st, totals);
  return _last_ok;
}

}  // namespace sluice::quota
