#pragma once
// One event loop per thread: an epoll set over its own SO_REUSEPORT listener
// and the connections it accepted, plus a timer heap that drives the
// time-to-first-token wait and the token pacing through epoll's timeout.
#include <simdjson.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "anthropic.hpp"
#include "responses.hpp"
#include "options.hpp"
#include "plan.hpp"
#include "state.hpp"
#include "wire.hpp"

namespace mock_vllm {

// Returns: a listening socket (non-blocking, SO_REUSEPORT) or -1 with
// `error` set. `port` 0 binds an ephemeral port; read it back with
// bound_port().
int open_listener(const std::string& host, uint16_t port, std::string& error);
int bound_port(int fd);

// Thread-local: created and run on one thread; owns every connection it accepted.
class worker {
 public:
  worker(const options& opts, shared_state& state, int listen_fd, unsigned index);
  ~worker();
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  // Runs the loop. Returns only when epoll itself fails.
  void run();

  struct connection;  // public for the llhttp callbacks in worker.cpp

 private:
  struct timer_entry {
    uint64_t due_ns;
    int fd;
    uint64_t serial;  // stale when it no longer matches the connection's
    bool operator>(const timer_entry& o) const noexcept { return due_ns > o.due_ns; }
  };

  void accept_all();
  void on_event(connection& c, uint32_t events);
  void on_readable(connection& c);
  void process_input(connection& c);
  void handle_request(connection& c);
  void route(connection& c, std::string_view method, std::string_view path);
  void start_generation(connection& c, endpoint kind);
  void start_messages(connection& c);
  void advance_messages(connection& c);
  void start_responses(connection& c);
  void advance_responses(connection& c);
  void advance(connection& c);
  void finish_generation(connection& c);
  // The reply's tokens as they fall due (every endpoint's pacing, one
  // loop): false when it stopped for a timer, a full socket or a failure.
  bool generate(connection& c);
  void emit_token(connection& c, uint32_t index);
  // --max-running: a started request takes a slot and its first token is
  // scheduled, or it waits for one (FCFS); a slot given back goes to the
  // longest waiting.
  void schedule(connection& c);
  void release_slot(connection& c);
  void fail_connection(connection& c);
  void fire_timers();
  void arm_timer(connection& c, uint64_t due_ns);
  void flush(connection& c);
  void peer_gone(connection& c);
  void destroy(connection& c);
  void set_write_interest(connection& c, bool on);
  void respond_json(connection& c, int status, std::string_view body,
                    std::string_view extra_headers = {});
  void respond_error(connection& c, int status, std::string_view type, std::string_view message);
  void respond_anthropic_error(connection& c, int status, std::string_view message);
  void append_uuid_hex(std::string& out);

  const options& _opts;
  shared_state& _state;
  int _listen_fd;
  int _epoll_fd = -1;
  uint64_t _interval_ns = 0;  // between tokens; 0 = no pacing
  uint64_t _ttft_ns = 0;
  uint64_t _now_ns = 0;
  std::string_view _date;
  http_date _dates;
  uint64_t _next_serial = 1;
  std::vector<connection*> _connections;  // by fd
  std::vector<connection*> _free;         // reusable, their buffers keep capacity
  std::vector<connection*> _graveyard;    // closed at the end of the loop turn
  std::deque<std::pair<int, uint64_t>> _slot_queue;  // (fd, queue_serial), oldest first
  uint32_t _slots_used = 0;
  std::priority_queue<timer_entry, std::vector<timer_entry>, std::greater<>> _timers;
  simdjson::dom::parser _json;
  plan _plan;
  anthropic_plan _anthropic_plan;
  responses_plan _responses_plan;
  std::string _scratch;  // one event or one body at a time
  std::string _error;
  std::string _line;
  std::mt19937_64 _random;
  std::vector<char> _read_buffer;
};

}  // namespace mock_vllm
