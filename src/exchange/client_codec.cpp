// What every client codec does the same way.
#include "client_codec.hpp"
#include "exchange.hpp"

#include "exchange_policy.hpp"
#include "wire.hpp"
#include "sluice/core/assert.hpp"

namespace sluice::proxy {

void client_codec::answer_error(exchange& x, uint16_t status, std::string_view message, std::string_view type,
                                std::string_view param, std::string_view code, bool close,
                                std::string_view extra_headers) noexcept {
  SLUICE_VERIFY(_policy != nullptr && _counters != nullptr);
  if (x.request_id_len == 0) _policy->make_request_id(x);
  char body[1024];
  const size_t bl = write_local_error(body, sizeof body, message, type, param, code);
  _counters->at(metrics::stat::local_errors).add();
  answer(x, status, std::string_view(body, bl), close, extra_headers,
         code.empty() ? std::string_view("invalid_request") : code);
}

}  // namespace sluice::proxy
