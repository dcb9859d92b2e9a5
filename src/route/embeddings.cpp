#include "sluice/route/embeddings.hpp"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "sluice/openai/error.hpp"

namespace sluice::route {

namespace {

// ASCII case-insensitive prefix test.
bool starts_with_nocase(std::string_view s, std::string_view p) noexcept {
  if (s.size() < p.size()) return false;
  for (size_t i = 0; i < p.size(); ++i) {
    if ((s[i] | 0x20) != (p[i] | 0x20)) return false;
  }
  return true;
}

}  // namespace

void write_embeddings_request(std::string& out, std::string_view host, std::string_view model,
                              std::string_view api_key, std::span<const std::string_view> inputs) {
  std::string body;
  body.reserve(64 + model.size());
  body += "{\"model\":";
  openai::append_json_string(body, model);
  body += ",\"input\":";
  if (inputs.size() == 1) {
    openai::append_json_string(body, inputs[0]);
  } else {
    body += '[';
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (i != 0) body += ',';
      openai::append_json_string(body, inputs[i]);
    }
    body += ']';
  }
  body += '}';
  out.clear();
  fmt::format_to(std::back_inserter(out),
                 "POST /v1/embeddings HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: "
                 "application/json\r\nUser-Agent: sluice-router\r\nConnection: close\r\nContent-Length: {}\r\n",
                 host, body.size());
  if (!api_key.empty()) fmt::format_to(std::back_inserter(out), "Authorization: Bearer {}\r\n", api_key);
  out += "\r\n";
  out += body;
}

bool embeddings_reply_whole(std::string_view so_far) noexcept {
  const size_t end = so_far.find("\r\n\r\n");
  if (end == std::string_view::npos) return false;
  std::string_view fields = so_far.substr(0, end + 2);
  const std::string_view body = so_far.substr(end + 4);
  size_t pos = fields.find("\r\n");
  while (pos != std::string_view::npos && pos + 2 < fields.size()) {
    const std::string_view line = fields.substr(pos + 2, fields.find("\r\n", pos + 2) - (pos + 2));
    if (starts_with_nocase(line, "content-length:")) {
      std::string_view v = line.substr(15);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      uint64_t n = 0;
      for (char c : v) {
        if (c < '0' || c > '9') break;
        n = n * 10 + static_cast<uint64_t>(c - '0');
        if (n > k_embeddings_reply_max) return false;
      }
      return body.size() >= n;
    }
    if (starts_with_nocase(line, "transfer-encoding:")) {
      return body.size() >= 5 && body.substr(body.size() - 5) == "0\r\n\r\n";
    }
    pos = fields.find("\r\n", pos + 2);
  }
  return false;  // delimited by the close
}

bool embeddings_reader::read(std::string_view reply, size_t inputs, std::vector<float>& out, uint32_t& dim,
                             std::string& why) {
  _http.reset();
  http::response_head head;
  const http::parse_status st = _http.parse_head(reply.data(), reply.size(), head);
  if (!st.ok()) {
    why = st.need_more() ? "the reply ended inside its head" : "the reply's head is not HTTP/1.1";
    return false;
  }
  if (head.status != 200) {
    why = fmt::format("status {}", head.status);
    return false;
  }
  _body.clear();
  http::body_sink sink;
  sink.ctx = this;
  sink.on_data = [](void* ctx, const char* data, size_t len) { static_cast<embeddings_reader*>(ctx)->_body.append(data, len); };
  const std::string_view rest = reply.substr(head.head_bytes);
  const http::body_status b = _http.feed_body(rest.data(), rest.size(), sink);
  if (b.error != errc::ok || (!b.complete && !_http.finish_at_eof())) {
    why = "the reply's body is cut or badly framed";
    return false;
  }
  simdjson::dom::element doc;
  if (_json.parse(_body).get(doc) != simdjson::SUCCESS) {
    why = "the reply is not JSON";
    return false;
  }
  simdjson::dom::array data;
  if (doc["data"].get_array().get(data) != simdjson::SUCCESS) {
    why = "the reply has no \"data\" list";
    return false;
  }
  out.clear();
  dim = 0;
  size_t count = 0;
  for (simdjson::dom::element item : data) {
    simdjson::dom::array vec;
    if (item["embedding"].get_array().get(vec) != simdjson::SUCCESS) {
      why = "an item of \"data\" has no \"embedding\" list of numbers";
      return false;
    }
    size_t n = 0;
    for (simdjson::dom::element v : vec) {
      double d = 0;
      if (v.get_double().get(d) != simdjson::SUCCESS || !std::isfinite(d)) {
        why = "an embedding holds something other than a finite number";
        return false;
      }
      out.push_back(static_cast<float>(d));
      ++n;
    }
    if (n == 0 || (count != 0 && n != dim)) {
      why = "the embeddings differ in dimension (or one is empty)";
      return false;
    }
    dim = static_cast<uint32_t>(n);
    ++count;
  }
  if (count != inputs) {
    why = fmt::format("{} embeddings for {} inputs", count, inputs);
    return false;
  }
  return true;
}

}  // namespace sluice::route
