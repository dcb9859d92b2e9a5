#pragma once
// exchange (private): the seam between an exchange and a backend protocol. The
// exchange's policy (exchange_policy) starts and ends attempts only through
// this; OpenAI over HTTP/1.1 (openai_http: vLLM, SGLang, trtllm-serve,
// llama.cpp) is the first adapter. An adapter answers the client through
// the exchange's codec (client_codec) and reports to the policy
// (exchange_policy: outcomes, the end of the exchange).
#include <cstdint>

#include "conn_memory.hpp"
#include "deadline.hpp"
#include "sluice/openai/request.hpp"

namespace sluice::proxy {

struct exchange;

class backend_adapter {
 public:
  virtual ~backend_adapter() = default;

  // Builds the backend's request from the client's (its fields `f` are
  // views valid only now: admission may park the exchange before the first
  // attempt). Returns: false when it answered the client instead (a 400
  // for what the protocol cannot carry, a 500 out of memory).
  virtual bool prepare(exchange& x, const openai::request_fields& f) noexcept = 0;
  // An attempt: picks a backend on the exchange's route (skipping those
  // tried), connects or takes a pooled connection, sends. Its outcome comes
  // back as the response relayed, a retry, or an answer to the client.
  virtual void start(exchange& x) noexcept = 0;
  // The exchange ends with its attempt still out (the client went, the
  // drain was cut): the backend request is cancelled at once (vLLM stops
  // generating when its connection closes).
  virtual void release(exchange& x) noexcept = 0;
  // A deadline of the attempt (upstream_connect, upstream_first_byte,
  // upstream_idle) fell due.
  virtual void on_timeout(exchange& x) noexcept = 0;
  // The codec's send of the response bytes given to it (send_response)
  // completed: the relay goes on.
  virtual void on_sent(exchange& x) noexcept = 0;
};

}  // namespace sluice::proxy
