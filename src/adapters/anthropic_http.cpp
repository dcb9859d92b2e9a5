// The Anthropic Messages API adapter's request: the client's chat or legacy
// completions request rewritten (openai::anthropic_request_writer) behind a
// head of sluice's own -- the backend's host, anthropic-version, the group's
// x-api-key, the request id -- into x.mem->up_head, sent by the HTTP/1.1
// transport.
#include "anthropic_http.hpp"

#include "client_codec.hpp"
#include "dialect_relay.hpp"
#include "wire.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/text.hpp"
#include "sluice/openai/error.hpp"

namespace sluice::proxy {

bool anthropic_http::prepare(exchange& x, const openai::request_fields& f) noexcept {
  const config::group_config& g = _s.cfg->groups[x.group];
  x.rsp.dialect = reply_dialect::anthropic;
  x.rsp.reader = this;
  x.rsp.cut_usage = false;
  x.rsp.client_usage = f.include_usage;
  if (x.req.endpoint == openai::endpoint::embeddings) {
    x.codec->answer_error(x, 400, "This model's backend speaks the Anthropic Messages API, which has no embeddings.",
                          "invalid_request_error", {}, "unsupported_endpoint", false);
    return false;
  }
  openai::anthropic_request_options opts;
  opts.model = g.backend_model.empty() ? f.model : std::string_view(g.backend_model);
  const uint64_t default_max = g.default_max_tokens != 0 ? g.default_max_tokens : _s.cfg->quota.default_max_tokens;
  opts.max_tokens_default = static_cast<int64_t>(default_max);
  openai::request_error err;
  const std::string_view client_body = request_body(x);
  bool written = false;
  try {
    if (x.req.native) {
      // A Messages client: its own bytes, the model token rewritten.
      const std::string_view b = x.codec->request_body(x);
      _body.assign(b.substr(0, x.req.native_model_begin));
      _body += '"';
      const size_t at = _body.size();
      _body.resize(at + opts.model.size() * 6 + 1);
      _body.resize(at + openai::json_escape(_body.data() + at, opts.model.size() * 6, opts.model));
      _body += '"';
      _body.append(b.substr(x.req.native_model_end));
      written = true;
    } else {
      written = x.req.endpoint == openai::endpoint::completions ? _writer.write_completion(client_body, opts, _body, err)
                                                            : _writer.write(client_body, opts, _body, err);
    }
  } catch (...) {  // std::string growth: out of memory
    x.codec->answer_error(x, 500, "Internal error.", "server_error", {}, {}, true);
    return false;
  }
  if (!written) {
    x.codec->answer_error(x, 400, err.message, "invalid_request_error", err.param, err.code, false);
    return false;
  }
  // The head, then the body, in one buffer: the request goes out as one
  // send and lends nothing of the client's bytes.
  byte_buf& o = x.mem->up_head;
  const std::string_view peer_ip = x.codec->peer_ip(x);
  if (!o.reserve(_body.size() + g.api_key.size() + peer_ip.size() + 512)) {
    x.codec->answer_error(x, 500, "Internal error.", "server_error", {}, {}, true);
    return false;
  }
  o.len = 0;
  append(o, "POST /v1/messages HTTP/1.1\r\nhost: ");
  x.host_offset = o.len;  // the attempt's backend goes here (openai_http::start)
  x.host_len = 0;
  // Written in place: the 512 bytes reserved past the body, key and peer
  // hold the fixed text, a 20-digit length and a 63-byte request id.
  text_writer w(o.data + o.len, o.cap - o.len);
  w.put("\r\ncontent-type: application/json\r\naccept: application/json\r\nanthropic-version: ");
  w.put(k_version);
  w.put("\r\ncontent-length: ");
  w.put_int(_body.size());
  w.put("\r\nx-request-id: ");
  w.put(std::string_view(x.request_id, x.request_id_len));
  w.put("\r\nx-forwarded-for: ");
  w.put(peer_ip);
  w.put("\r\n");
  SLUICE_VERIFY(w.ok);
  o.len = static_cast<uint32_t>(w.p - o.data);
  if (!g.api_key.empty()) {
    // The group's own credential (api_key_env); the client's key never leaves.
    append(o, "x-api-key: ");
    append(o, g.api_key);
    append(o, "\r\n");
  }
  append(o, "\r\n");
  append(o, _body);
  x.up_iov[0] = {};
  x.up_iov_count = 1;
  x.up_body_len = _body.size();
  return true;
}

}  // namespace sluice::proxy
