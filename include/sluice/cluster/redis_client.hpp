#pragma once
// cluster: a Redis connection driven by a sluice reactor (hiredis's async
// API, with an adapter of our own: hiredis's addRead/addWrite hooks arm one
// IORING_OP_POLL_ADD per direction on the context's fd, re-armed after each
// readiness). Never a blocking call once started: the connect is
// non-blocking, AUTH and SCRIPT LOAD are pipelined behind it, every command
// has a deadline.
//
// Control-thread. One per process, from start-up to shutdown; the reactor
// must outlive it (a poll still in flight at destruction finishes on the
// reactor and frees its own state then).
//
// Failure model: a command slower than timeout_ms, a failed connect, a
// server that closes: the connection is dropped, every pending command's
// callback gets its error exactly once (from inside the drop), and a new
// connection is tried after a backoff (backoff_min_ms doubling up to
// backoff_max_ms; reset once a connection is ready). The state change is
// logged once ("connected" / "unreachable"), never per error.
//
// Lifetimes: a callback never runs after the client is destroyed (the
// destructor drops pending commands without calling them). Callbacks may
// issue new commands; they must not destroy the client.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/cluster/scripts.hpp"
#include "sluice/core/result.hpp"
#include "sluice/shard/reactor.hpp"

struct redisAsyncContext;

namespace sluice::cluster {

struct redis_options {
  std::string host = "127.0.0.1";   // a name is resolved once, by create()
  uint16_t port = 6379;
  std::string password;             // "" = no AUTH
  std::string key_prefix = "sluice:";
  uint32_t timeout_ms = 200;        // per command, from send to reply
  uint32_t connect_timeout_ms = 1000;  // TCP connect + AUTH + SCRIPT LOAD
  uint32_t backoff_min_ms = 100;
  uint32_t backoff_max_ms = 5000;
  // Ends the "unreachable" log line: what the owner does meanwhile.
  std::string fallback_note = "limits fall back to the local share";
  bool quiet = false;               // no connected / unreachable lines (an owner that logs its own)
};

// A script's answer (scripts.hpp).
struct bucket_reply {
  int64_t tokens = 0;
  int64_t level = 0;
  int64_t server_now_ms = 0;
  int64_t outstanding = 0;
};

// errc::upstream_connect: not connected (the command was not sent);
// upstream_timeout: a command timed out and the connection was dropped;
// upstream_closed: the connection went away with the command pending;
// upstream_protocol: an error reply (the text is last_error()) or a reply
// of the wrong shape.
using bucket_fn = std::function<void(result<bucket_reply>)>;

// One hash of the budget script (scripts.hpp, "budget"): this instance's
// own totals in it and the hash's expiry; the answer is every instance's sums.
struct budget_counter {
  std::string key;  // budget_key()
  uint64_t tokens = 0;
  uint64_t spend_nano = 0;
  int64_t expire_at_ms = 0;
};
struct budget_sums {
  uint64_t tokens = 0;
  uint64_t spend_nano = 0;
  bool operator==(const budget_sums&) const = default;
};
// Errors as bucket_fn's; on success one budget_sums per counter, in order.
using budget_fn = std::function<void(result<std::vector<budget_sums>>)>;

// A plain command's answer: a bulk or status string, an integer, or nil.
struct command_reply {
  bool nil = false;
  std::string text;
  int64_t integer = 0;
};
// Errors as bucket_fn's (an error reply: upstream_protocol).
using command_fn = std::function<void(result<command_reply>)>;

class redis_client {
 public:
  struct counters {
    uint64_t commands = 0;     // script calls sent (EVALSHA and EVAL fallbacks), budget ones included
    uint64_t errors = 0;       // failed script calls + failed connection attempts: sluice_cluster_redis_errors_total
    uint64_t reconnects = 0;   // connection attempts after the first
    uint64_t noscript = 0;     // EVALSHA answered NOSCRIPT (then sent as EVAL)
  };

  // Resolves o.host (a cold-path getaddrinfo; reconnects reuse the address).
  // Returns: the client, not yet connecting (start() does), or
  // errc::upstream_connect with a log line when the host does not resolve.
  static result<std::unique_ptr<redis_client>> create(shard::reactor& r, redis_options o);
  ~redis_client();
  redis_client(const redis_client&) = delete;
  redis_client& operator=(const redis_client&) = delete;

  // Starts the first connection attempt.
  void start();
  // The owner calls this each loop turn: command deadlines, connect
  // deadlines, reconnect backoff (granularity: the loop's tick).
  void on_iteration(uint64_t now_ms);

  // Connected, authenticated, scripts loaded: sluice_cluster_connected.
  bool connected() const noexcept { return _ready; }
  const counters& stats() const noexcept { return _stats; }
  // The last error reply's or connect failure's text (for logs and tests).
  const std::string& last_error() const noexcept { return _last_error; }
  const redis_options& options() const noexcept { return _o; }

  // The lease protocol (scripts.hpp). Returns: false when not connected (fn
  // is then never called); else fn is called exactly once, later.
  [[nodiscard]] bool lease(std::string_view key_id, uint64_t limit_per_minute, uint64_t want,
                           std::string_view instance_id, uint32_t ttl_ms, bucket_fn fn);
  [[nodiscard]] bool give_back(std::string_view key_id, uint64_t limit_per_minute, uint64_t amount,
                               std::string_view instance_id, bucket_fn fn);
  [[nodiscard]] bool charge(std::string_view key_id, uint64_t limit_per_minute, uint64_t amount,
                            std::string_view instance_id, bucket_fn fn);

  // The budget counters: raises this instance's own fields and answers
  // every instance's sums, one per hash in order (scripts.hpp). Returns: false when not connected
  // (fn is then never called); else fn is called exactly once, later.
  [[nodiscard]] bool budget(const std::vector<budget_counter>& hashes, std::string_view instance_id, budget_fn fn);

  // A plain command (GET, SET, DEL...), `argv` whole. Returns: false when
  // not connected (fn is then never called); else fn is called exactly
  // once, later.
  [[nodiscard]] bool command(std::vector<std::string> argv, command_fn fn);

  // The Redis key holding key_id's bucket.
  std::string bucket_key(std::string_view key_id) const;
  // The hash of one subject's budget window: `subject` "key" or "group",
  // `window` "day" or "month" with its number (quota::budget_windows). The
  // name comes last, so no character in it can make two keys meet.
  std::string budget_key(std::string_view subject, std::string_view window, int64_t n, std::string_view name) const;

  struct io;       // the fd's polls; outlives the client while one is in flight
  struct pending;  // one command awaiting its reply

 private:
  redis_client(shard::reactor& r, redis_options o, std::string address);

  void connect();
  void drop(errc why, std::string_view what);
  void on_context_gone();  // hiredis's cleanup hook: the context is being freed
  void on_setup_reply(pending* p, const void* reply);
  void on_script_reply(pending* p, const void* reply);
  void on_budget_reply(pending* p, const void* reply);
  void on_command_reply(pending* p, const void* reply);
  void fail(pending* p, errc why);
  bool send_script(pending* p, bool by_sha);
  // Sends `head` then p->args; on success p is linked with its deadline.
  bool send_argv(pending* p, std::initializer_list<std::string_view> head);
  bool call(script s, std::vector<std::string> args, bucket_fn fn);  // args: KEYS[1], then ARGV
  bool send(pending* p);  // a new call's first send (EVALSHA); false: p is freed, its callback never runs
  void link(pending* p);
  void unlink(pending* p);
  bool send_setup(pending* p, std::vector<std::string> argv);
  void log_state(bool up, std::string_view why);

  static void on_reply(redisAsyncContext* ac, void* reply, void* privdata);

  shard::reactor& _r;
  redis_options _o;
  std::string _address;           // numeric, from create()
  redisAsyncContext* _ac = nullptr;
  io* _io = nullptr;
  bool _ready = false;
  bool _destroying = false;
  bool _dropping = false;         // drop() began; the cleanup hook ends it
  bool _started = false;
  uint32_t _setup_left = 0;       // AUTH / SCRIPT LOAD replies still awaited
  uint64_t _connect_deadline_ms = 0;
  uint64_t _next_connect_ms = 0;
  uint32_t _backoff_ms = 0;
  errc _drop_reason = errc::upstream_closed;
  enum class logged : uint8_t { nothing, up, down } _logged = logged::nothing;
  std::string _sha[k_script_count];
  pending* _head = nullptr;       // in send order: the oldest has the first deadline
  pending* _tail = nullptr;
  counters _stats;
  std::string _last_error;
};

}  // namespace sluice::cluster
