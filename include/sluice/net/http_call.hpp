#pragma once
// net: one HTTP/1.1 request on a fresh connection, answered once -- the
// client of the cold paths that ask a backend something on sluice's own
// behalf (the embeddings router: a prompt's vector on a shard, the
// examples' vectors on the control thread). Not the proxy's upstream path:
// no pool, no buffer ring, one operation in flight at a time.
//
// The owner writes the request bytes (with `Connection: close`) into
// request(), then start(). The reply is read until the peer's EOF, until
// `whole` says the bytes so far are a complete message, or until reply_max
// bytes (too_large). `done` is called exactly once per start(), from a
// completion or from expire() / a failed start, unless cancel() came first.
//
// Lifetimes: this object, its request and its reply are the kernel's while
// an operation is in flight (ops() > 0): a call is started again or
// destroyed only when idle() (the destructor asserts it). A timeout or a
// cancel shuts the socket down, which makes the pending operation complete
// at once; the fd is closed on that completion.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/shard/reactor.hpp"

namespace sluice::net {

class http_call {
 public:
  enum class outcome : uint8_t { ok, connect_failed, io_error, timeout, too_large };
  using done_fn = void (*)(void* ctx, http_call& call, outcome o);
  // Returns: whether `so_far` is a whole HTTP message (a reply may end
  // before the peer closes).
  using whole_fn = bool (*)(std::string_view so_far);

  explicit http_call(size_t reply_max) : _reply_max(reply_max) {}
  ~http_call();
  http_call(const http_call&) = delete;
  http_call& operator=(const http_call&) = delete;

  // The bytes to send; written by the owner before start().
  std::string& request() noexcept { return _request; }
  // Cold-ish path. Requires idle(). Connects to `to`, sends request(),
  // reads the reply. `deadline_ms`: on the reactor's clock; expire() ends
  // the call after it. Returns: false when no socket could be made (done is
  // not called then).
  bool start(shard::reactor& r, const config::socket_address& to, uint64_t deadline_ms, done_fn done, void* ctx,
             whole_fn whole = nullptr) noexcept;
  // Past the deadline: the call ends with `timeout`.
  void expire(uint64_t now_ms) noexcept;
  // The owner no longer wants the answer: done is not called; the
  // operation in flight drains.
  void cancel() noexcept;

  bool running() const noexcept { return _done != nullptr; }  // started, done not yet called
  bool idle() const noexcept { return _ops == 0 && _fd < 0; }
  uint32_t ops() const noexcept { return _ops; }
  std::string_view reply() const noexcept { return {_reply.data(), _reply_len}; }
  uint64_t deadline_ms() const noexcept { return _deadline_ms; }
  static std::string_view to_string(outcome o) noexcept;

 private:
  struct io : shard::completion {
    http_call* self = nullptr;
  };
  enum class step : uint8_t { connect, send, recv };
  static void on_cqe(shard::completion* c, const io_uring_cqe* cqe);
  void advance(int res) noexcept;
  void submit_send() noexcept;
  void submit_recv() noexcept;
  void finish(outcome o) noexcept;   // calls done (once) and shuts the socket down
  void settle() noexcept;            // no operation in flight: the fd closes
  void abort_pending() noexcept;     // the operation in flight completes at once

  shard::reactor* _r = nullptr;
  size_t _reply_max;
  std::string _request;
  std::vector<char> _reply;          // sized reply_max on the first start
  size_t _reply_len = 0;
  size_t _sent = 0;
  int _fd = -1;
  uint32_t _ops = 0;
  step _step = step::connect;
  sockaddr_storage _peer{};          // the kernel reads it when the connect is submitted
  socklen_t _peer_len = 0;
  uint64_t _deadline_ms = 0;
  done_fn _done = nullptr;
  void* _ctx = nullptr;
  whole_fn _whole = nullptr;
  io _op;
};

}  // namespace sluice::net
