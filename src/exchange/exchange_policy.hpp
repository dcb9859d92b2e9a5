#pragma once
// exchange (private): the seam between the exchange's two sides and its
// policy. A client codec and a backend adapter reach the policy only
// through this; shard_server is its one implementation (a test may hold
// another). With client_codec.hpp and backend_adapter.hpp it is the whole
// of what the parts of a shard's server know of each other:
//
//   codec --client_codec--> | exchange | <--backend_adapter-- policy
//         --exchange_policy------------------------------------> policy
//   adapter --exchange_policy----------------------------------> policy
//   adapter --client_codec--> codec
//
// Every call is made on the shard's thread, from a completion or a timer;
// none blocks.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace sluice::proxy {

struct exchange;
class backend_adapter;

class exchange_policy {
 public:
  // --- the codec's calls, in the order of a request ---------------------------
  // Accounting (audit + metrics) from the head's first byte until
  // end_request().
  virtual void open_request(exchange& x) noexcept = 0;
  // x.request_id: the client's X-Request-ID where it is a valid one, else
  // sluice's own.
  virtual void make_request_id(exchange& x) noexcept = 0;
  // A parsed head: the endpoint by path and method, and the key, before
  // any body is read. Returns: whether the request goes on; else it was
  // answered (404, 405, 401).
  [[nodiscard]] virtual bool accept_head(exchange& x, bool has_body) noexcept = 0;
  // The whole request is in: answered here, or admitted and sent on.
  virtual void dispatch(exchange& x) noexcept = 0;
  // sluice's own response fields for x (x-request-id aside): rate limits,
  // budgets, x-sluice-group. Returns: the bytes written (at most cap).
  virtual size_t write_response_headers(const exchange& x, char* out, size_t cap) noexcept = 0;
  // The client went away mid-exchange: cancelled, audited 499.
  virtual void cancel(exchange& x) noexcept = 0;
  // A parked exchange leaves its wait (its client side closes).
  virtual void unpark(exchange& x) noexcept = 0;
  // The exchange's answer went out (or its client side closed): settled,
  // audited, counted.
  virtual void end_request(exchange& x) noexcept = 0;
  // The adapter a new exchange starts with, until its model names a group.
  virtual backend_adapter* adapter() noexcept = 0;

  // --- the adapter's calls ------------------------------------------------------
  // Passive health: a backend's outcome (failures always, a success after
  // a failure).
  virtual void report_outcome(uint32_t backend, bool failure) noexcept = 0;
  // A relayed batch: fair admission moves the key's counter by the output
  // so far.
  virtual void fair_progress(exchange& x) noexcept = 0;
  // A native Responses reply of `backend` named `response_id`: kept, so
  // previous_response_id reaches that backend (fire and forget, once).
  virtual void keep_route(exchange& x, uint32_t backend, std::string_view response_id) noexcept = 0;
  // A translated Responses reply rendered whole: kept in the store (fire
  // and forget, once).
  virtual void keep_response(exchange& x) noexcept = 0;

 protected:
  exchange_policy() = default;
  ~exchange_policy() = default;
  exchange_policy(const exchange_policy&) = delete;
  exchange_policy& operator=(const exchange_policy&) = delete;
};

}  // namespace sluice::proxy
