#pragma once
// exchange (private): the seam between an exchange and its client side. The
// exchange's policy (exchange_policy) and the backend adapters reach the
// client only through this; HTTP/1.1 (h1_codec) is the first codec, and a codec
// that carries many exchanges on one connection (HTTP/2) finds the stream
// of each from the exchange it is given.
#include <sys/uio.h>

#include <cstdint>
#include <string_view>

#include "conn_memory.hpp"
#include "deadline.hpp"
#include "sluice/http/response.hpp"
#include "sluice/metrics/registry.hpp"

namespace sluice::proxy {

struct exchange;

class exchange_policy;

class client_codec {
 public:
  virtual ~client_codec() = default;

  // --- the request ----------------------------------------------------------
  // The request's body, decoded and whole, with simdjson's padding readable
  // after it (the reader parses it in place); valid until the exchange ends
  // (and, while lent to an upstream send, unmoved).
  virtual std::string_view request_body(const exchange& x) const noexcept = 0;
  // The client's address, as text (x-forwarded-for).
  virtual std::string_view peer_ip(const exchange& x) const noexcept = 0;

  // --- where the exchange stands ----------------------------------------------
  // Parked until the shard's quota slice can admit it (no deadline of its
  // own: the waiter list bounds the wait).
  virtual void wait_for_quota(exchange& x) noexcept = 0;
  // Waits for a backend: `k` is upstream_connect or upstream_first_byte (or
  // none: no deadline yet), capped at the exchange's total deadline.
  virtual void wait_for_backend(exchange& x, deadline_kind k, uint64_t ms) noexcept = 0;

  // --- answers sluice writes itself ---------------------------------------------
  // A JSON body with sluice's fields; `error_code` (a static string) goes
  // to the audit record. `close`: the connection closes after it.
  virtual void answer(exchange& x, uint16_t status, std::string_view body, bool close,
                      std::string_view extra_headers, std::string_view error_code) noexcept = 0;
  // An error in OpenAI's shape (counted as sluice's own error), sent with
  // answer() (client_codec.cpp: the same for every codec; virtual for a
  // test's fake).
  virtual void answer_error(exchange& x, uint16_t status, std::string_view message, std::string_view type,
                            std::string_view param, std::string_view code, bool close,
                            std::string_view extra_headers = {}) noexcept;
  // The exchange cannot go on (out of memory): the client side closes.
  virtual void fail(exchange& x) noexcept = 0;

  // --- the response, relayed from a backend -------------------------------------
  // Whether the client takes the backend's chunked framing as it comes
  // (HTTP/1.1); else the adapter sends the payload alone (HTTP/1.0: close-
  // delimited).
  virtual bool takes_chunked(const exchange& x) const noexcept = 0;
  // The client's response head from the backend's: its status and end-to-
  // end fields, sluice's own (x-request-id, rate limits, processing time);
  // `dechunked`: the body goes out without its chunk framing. Staged: it
  // goes out first with the next send_response. Returns: false when out of
  // memory.
  virtual bool stage_response_head(exchange& x, const http::response_head& rh, bool dechunked) noexcept = 0;
  // The response flows: no byte from the backend for `idle_ms` ends it
  // (upstream_idle, capped at the exchange's total deadline).
  virtual void stream_wait(exchange& x, uint64_t idle_ms) noexcept = 0;
  // Whether send_response() takes pieces still in the backend's chunked
  // framing and sends their data alone, read where they lie (HTTP/2: DATA
  // frames copied from the backend's buffer). Else the adapter removes the
  // framing by copy (HTTP/1.0).
  virtual bool dechunks(const exchange&) const noexcept { return false; }
  // Sends the staged head (with_head) and body[0..n) (n <= 3; at least one
  // of the two). `lender`: whose buffer the pieces read, kept until the
  // send completes. The adapter hears of the completion (on_sent).
  // `chunked`: bit i set when body[i] holds whole chunks of the backend's
  // framing (only where dechunks()).
  virtual void send_response(exchange& x, bool with_head, const iovec* body, uint8_t n, buffer_lender* lender,
                             uint8_t chunked) noexcept = 0;
  // The response ended and every byte of it went out: the exchange is
  // accounted as any answer, and the connection goes on (or closes).
  virtual void response_done(exchange& x) noexcept = 0;

  // --- the request bytes, lent to a backend send ----------------------------------
  // A send reads request_body() (and the exchange's upstream head): the
  // client side's object stays, and the bytes stay where they are, until
  // return_request_bytes. Only one such send at a time.
  virtual void lend_request_bytes(exchange& x) noexcept = 0;
  // The send completed. Returns: whether the exchange goes on; false when
  // its client side closed meanwhile -- then `x` is gone with it.
  [[nodiscard]] virtual bool return_request_bytes(exchange& x) noexcept = 0;
  // The exchange was answered while a send still read its bytes, and the
  // codec was told to wait (after_upstream_send::next_request): go on.
  virtual void request_bytes_free(exchange& x) noexcept = 0;

  // The exchange's policy (null in a test's fake codec).
  exchange_policy* policy() const noexcept { return _policy; }

 protected:
  client_codec() noexcept = default;
  client_codec(exchange_policy& policy, metrics::shard_metrics& m) noexcept : _policy(&policy), _counters(&m) {}

 private:
  exchange_policy* _policy = nullptr;           // set by every codec but a test's fake
  metrics::shard_metrics* _counters = nullptr;
};

}  // namespace sluice::proxy
