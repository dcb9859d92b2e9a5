#pragma once
// mock-triton's event loop: one thread, an epoll set over the listener and
// every HTTP/2 connection (libnghttp2 sessions: framing, HPACK, flow
// control), and a timer heap that paces the token responses of all streams
// without blocking any of them.
#include <simdjson.h>

#include <cstdint>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "options.hpp"

namespace mock_triton {

// Process-wide, one per run; created and run on the main thread.
class server {
 public:
  server(const options& opts, int listen_fd);
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  // Runs the loop. Returns only when epoll itself fails.
  void run();

  struct connection;  // public for the nghttp2 callbacks in server.cpp
  struct stream;

  // Called from the nghttp2 callbacks.
  void on_request_headers(connection& c, stream& s);
  void on_request_data(connection& c, stream& s);
  void on_request_end(connection& c, stream& s);
  void on_stream_closed(connection& c, stream& s);

 private:
  struct timer_entry {
    uint64_t due_ns;
    uint64_t connection_serial;
    int32_t stream_id;
    uint64_t serial;  // stale when it no longer matches the stream's
    bool operator>(const timer_entry& o) const noexcept { return due_ns > o.due_ns; }
  };

  void accept_all();
  void on_readable(connection& c);
  void flush(connection& c);
  void destroy(connection& c);
  void set_write_interest(connection& c, bool on);
  void fire_timers();
  void arm_timer(connection& c, stream& s, uint64_t due_ns);

  void start_infer(connection& c, stream& s);
  void produce(connection& c, stream& s);
  void respond_unary(connection& c, stream& s);
  void submit_head(connection& c, stream& s);
  void submit_trailers_only(connection& c, stream& s, uint32_t status, std::string_view message);
  void end_body(connection& c, stream& s, uint32_t status, std::string_view message);
  void wake(connection& c, stream& s);
  void print_line(const std::string& line);

  const options& _opts;
  int _listen_fd;
  int _epoll_fd = -1;
  uint64_t _interval_ns = 0;
  uint64_t _ttft_ns = 0;
  uint64_t _now_ns = 0;
  uint64_t _next_serial = 1;
  std::unordered_map<uint64_t, std::unique_ptr<connection>> _connections;  // by serial
  std::vector<uint64_t> _graveyard;  // serials closed at the end of the loop turn
  std::priority_queue<timer_entry, std::vector<timer_entry>, std::greater<>> _timers;
  simdjson::dom::parser _json;
  std::vector<char> _read_buffer;
};

}  // namespace mock_triton
