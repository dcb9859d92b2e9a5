#pragma once
// The backend adapters between fakes on both of their seams and a real
// backend socket: a fake client codec that records what the client is sent
// (head, body bytes, the end, answers), a fake policy that records the
// adapter's reports, and a scripted backend on a loopback listener (port
// 0) that the test accepts, reads and answers by hand, in whatever pieces
// it chooses. The shard's reactor runs one turn at a time until what the
// test waits for holds, or a bounded number of turns has passed.
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <simdjson.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "anthropic_http.hpp"
#include "client_codec.hpp"
#include "exchange.hpp"
#include "exchange_policy.hpp"
#include "openai_http.hpp"
#include "shard_context.hpp"
#include "upstream_conn.hpp"
#include "sluice/config/config.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/openai/request.hpp"
#include "sluice/shard/reactor.hpp"

namespace sluice::adapters_test {

namespace proxy = sluice::proxy;
using proxy::exchange;

// --- the policy seam -----------------------------------------------------------

// Records what the adapter reports; the codec-side calls are never made here.
struct fake_policy final : proxy::exchange_policy {
  struct outcome {
    uint32_t backend;
    bool failure;
  };
  std::vector<outcome> outcomes;
  int fair_progress_calls = 0;
  std::vector<std::string> kept_routes;

  void open_request(exchange&) noexcept override {}
  void make_request_id(exchange&) noexcept override {}
  bool accept_head(exchange&, bool) noexcept override { return true; }
  void dispatch(exchange&) noexcept override {}
  size_t write_response_headers(const exchange&, char*, size_t) noexcept override { return 0; }
  void cancel(exchange&) noexcept override {}
  void unpark(exchange&) noexcept override {}
  void end_request(exchange&) noexcept override {}
  proxy::backend_adapter* adapter() noexcept override { return nullptr; }
  void report_outcome(uint32_t backend, bool failure) noexcept override { outcomes.push_back({backend, failure}); }
  void fair_progress(exchange&) noexcept override { ++fair_progress_calls; }
  void keep_route(exchange&, uint32_t, std::string_view id) noexcept override { kept_routes.emplace_back(id); }
  void keep_response(exchange&) noexcept override {}

  int failures_of(uint32_t backend) const {
    int n = 0;
    for (const outcome& o : outcomes) n += o.backend == backend && o.failure ? 1 : 0;
    return n;
  }
};

// --- the client seam -----------------------------------------------------------

// One exchange's client side. A send of response bytes is taken at once
// and completes only when the test's loop says so (complete_send), never
// inside send_response: the adapter hears of it later, as from a CQE.
struct fake_codec final : proxy::client_codec {
  std::string body;  // the request body, with simdjson's padding after it
  size_t body_len = 0;
  bool chunked_client = true;  // false: an HTTP/1.0 client

  // What the client got.
  bool head_staged = false;
  bool head_sent = false;
  bool head_dechunked = false;
  uint16_t head_status = 0;
  std::vector<std::pair<std::string, std::string>> head_fields;
  std::string sent;  // the body pieces, in order, as sent
  int sends = 0;
  bool done = false;
  bool failed = false;
  bool answered = false;
  uint16_t answer_status = 0;
  std::string answer_body;  // answer(): the body; answer_error(): the message
  std::string answer_code;
  std::string answer_extra;
  std::vector<proxy::deadline_kind> backend_waits;
  int stream_waits = 0;

  // The send out, until the test's loop completes it.
  exchange* send_for = nullptr;
  proxy::buffer_lender* pin = nullptr;

  std::string_view request_body(const exchange&) const noexcept override { return {body.data(), body_len}; }
  std::string_view peer_ip(const exchange&) const noexcept override { return "192.0.2.7"; }
  void wait_for_quota(exchange&) noexcept override {}
  void wait_for_backend(exchange&, proxy::deadline_kind k, uint64_t) noexcept override { backend_waits.push_back(k); }
  void answer(exchange& x, uint16_t status, std::string_view b, bool, std::string_view extra,
              std::string_view code) noexcept override {
    answered = true;
    answer_status = status;
    answer_body = std::string(b);
    answer_extra = std::string(extra);
    answer_code = std::string(code);
    x.status = status;
  }
  void answer_error(exchange& x, uint16_t status, std::string_view message, std::string_view, std::string_view,
                    std::string_view code, bool, std::string_view extra) noexcept override {
    answered = true;
    answer_status = status;
    answer_body = std::string(message);
    answer_code = std::string(code);
    answer_extra = std::string(extra);
    x.status = status;
    x.error_code = code;
  }
  void fail(exchange&) noexcept override { failed = true; }
  bool takes_chunked(const exchange&) const noexcept override { return chunked_client; }
  bool stage_response_head(exchange&, const http::response_head& rh, bool dechunked) noexcept override {
    // The head's views read the backend's buffer: copied now, as a codec does.
    head_staged = true;
    head_dechunked = dechunked;
    head_status = rh.status;
    head_fields.clear();
    http::header h;
    for (http::header_fields it = rh.fields(); it.next(h);) head_fields.emplace_back(std::string(h.name), std::string(h.value));
    return true;
  }
  void stream_wait(exchange&, uint64_t) noexcept override { ++stream_waits; }
  void send_response(exchange& x, bool with_head, const iovec* b, uint8_t n, proxy::buffer_lender* lender,
                     uint8_t) noexcept override {
    CHECK(send_for == nullptr);  // one send at a time
    CHECK((with_head || n != 0));
    if (with_head) {
      CHECK(head_staged);
      CHECK_FALSE(head_sent);
      head_sent = true;
    }
    for (uint8_t i = 0; i < n; ++i) sent.append(static_cast<const char*>(b[i].iov_base), b[i].iov_len);
    ++sends;
    send_for = &x;
    pin = lender;
  }
  void response_done(exchange&) noexcept override {
    CHECK(send_for == nullptr);  // every byte of it went out first
    done = true;
  }
  void lend_request_bytes(exchange& x) noexcept override {
    CHECK_FALSE(x.up_send_inflight);
    x.up_send_inflight = true;
  }
  bool return_request_bytes(exchange& x) noexcept override {
    CHECK(x.up_send_inflight);
    x.up_send_inflight = false;
    return true;
  }
  void request_bytes_free(exchange&) noexcept override {}

  // The send went out: its lender gets its buffer back, then the adapter
  // hears of it (h1_send.cpp's order).
  void complete_send() {
    exchange* x = send_for;
    proxy::buffer_lender* l = pin;
    send_for = nullptr;
    pin = nullptr;
    if (l != nullptr) l->give_back(l);
    x->adapter->on_sent(*x);
  }
  std::string field(std::string_view name) const {
    for (const auto& [n, v] : head_fields) {
      if (n.size() == name.size() && strncasecmp(n.data(), name.data(), n.size()) == 0) return v;
    }
    return {};
  }
  bool ended() const { return done || answered || failed; }
};

// --- the backend ---------------------------------------------------------------

int open_fds();

// A listener on 127.0.0.1, port 0, and the connections it accepted. All
// non-blocking: the test reads and writes between the reactor's turns.
struct scripted_backend {
  int listen_fd = -1;
  uint16_t port = 0;
  std::vector<int> conns;
  std::vector<std::string> inbox;  // bytes read from each connection, not yet taken as a request

  // `listening` false: a bound port nobody listens on (a connect is refused).
  explicit scripted_backend(bool listening = true);
  ~scripted_backend() { close_all(); }
  scripted_backend(const scripted_backend&) = delete;
  scripted_backend& operator=(const scripted_backend&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
  // Returns: whether a connection was accepted now.
  bool try_accept();
  // Reads what is there; returns a whole request (head and its
  // content-length body) when one has come, taking it from the inbox.
  bool try_request(size_t conn, std::string& out);
  // Whether the peer closed the connection (EOF or reset).
  bool peer_closed(size_t conn);
  void write(size_t conn, std::string_view bytes);
  // A close that sends RST instead of FIN (SO_LINGER 0).
  void reset(size_t conn);
  void close_conn(size_t conn);
  void close_all();
};

// --- the shard -----------------------------------------------------------------

// One request: its head and body bytes, its exchange and its client side.
struct call {
  std::string head_bytes;
  http::request_parser parser{http::limits{}};
  exchange x;
  proxy::exchange_memory mem;
  fake_codec codec;
  std::string request_id;
};

struct call_options {
  std::string path = "/v1/chat/completions";
  std::string headers;  // extra field lines, each with its CRLF
  bool http10 = false;
  uint32_t group = 0;
  uint32_t pinned = UINT32_MAX;  // a global backend index the route must take
  // A Responses or Messages client: the body is then the canonical chat
  // body its request was written as, and the reply is rendered.
  dialect::client_dialect speaks = dialect::client_dialect::chat;
};

// One shard's parts for an adapter under test: the config of `groups` (each
// `{<tag>i}` in it replaced by urls[i], one key "sk-client"), its ring,
// metrics and context. Shared by every adapter's fixture.
struct shard_parts {
  std::shared_ptr<const config::config> config;
  std::unique_ptr<shard::reactor> ring;
  std::unique_ptr<metrics::registry> registry;
  std::unique_ptr<proxy::shard_context> ctx;
};
shard_parts make_shard_parts(std::string_view groups, std::string_view tag, const std::vector<std::string>& urls);

// A new call's request, made and handed to `adapter` as a shard's policy
// would: its head parsed, its body read, then prepare and start. Shared by
// every adapter's fixture.
call& start_call(std::vector<std::unique_ptr<call>>& calls, std::string_view body, const call_options& o,
                 proxy::backend_adapter* adapter, openai::request_reader& reader, uint64_t now_ms);
// Every call's send that is out completes (as the codec's CQEs would).
void complete_sends(std::vector<std::unique_ptr<call>>& calls);

// One shard's OpenAI and Anthropic adapters on a config whose `{b0}`,
// `{b1}` ... stand for the scripted backends' URLs, in order.
struct shard_fixture {
  std::vector<std::unique_ptr<scripted_backend>> backends;
  std::shared_ptr<const config::config> config;
  std::unique_ptr<shard::reactor> ring;
  std::unique_ptr<metrics::registry> registry;
  std::unique_ptr<proxy::shard_context> ctx;
  fake_policy policy;
  std::unique_ptr<proxy::openai_http> http;
  std::unique_ptr<proxy::anthropic_http> anthropic;
  openai::request_reader reader{1u << 20};
  std::vector<std::unique_ptr<call>> calls;
  int fds_after_setup = 0;

  // `groups`: TOML [[group]] tables; `listening`: per backend, whether it
  // listens (false: a refused port).
  explicit shard_fixture(std::string_view groups, std::vector<bool> listening = {true});
  ~shard_fixture();
  shard_fixture(const shard_fixture&) = delete;
  shard_fixture& operator=(const shard_fixture&) = delete;

  scripted_backend& backend(size_t i = 0) { return *backends[i]; }
  uint32_t backend_index(size_t i) const;

  // A request of `body` made, prepared and started on `adapter` (the
  // OpenAI one by default). Returns: the call (owned by the fixture).
  call& start(std::string_view body, const call_options& o = {}, proxy::backend_adapter* adapter = nullptr);

  // The reactor's turns, each after the sends out completed, until
  // `cond` holds. Returns: whether it held within the bound.
  template <class Cond>
  bool pump(Cond cond, int turns_max = 3000) {
    for (int i = 0; i < turns_max; ++i) {
      complete_sends();
      if (cond()) return true;
      ring->run_once(2);
      http->on_iteration();
    }
    complete_sends();
    return cond();
  }
  void complete_sends();
  // Everything the backend wrote has reached the adapter and been handled:
  // its socket is empty, no completion waits, no send is out (or the
  // exchange has ended). What makes each write of a scripted reply one
  // receive of its own.
  bool settled(const call& c);
  void write_settled(call& c, size_t conn, std::string_view bytes);

  // The usual script: accept (or reuse) the connection, read the request,
  // answer it in `pieces`, each handled before the next. Returns the request.
  // The connection it came on is last_conn.
  std::string serve(call& c, const std::vector<std::string>& pieces, size_t backend_i = 0);
  // Accepts what connects and reads until a whole request has come on one
  // of the backend's connections. Returns: that connection.
  size_t await_request(size_t backend_i, std::string& req);
  size_t last_conn = 0;
};

// --- bytes -------------------------------------------------------------------

// One chat group on the first scripted backend; a stream request to it;
// the head of a chunked event stream.
inline constexpr std::string_view k_chat_group = R"(
[[group]]
name = "chat"
models = ["chat-*"]
backends = ["{b0}"]
)";
inline constexpr std::string_view k_chat_stream =
    R"({"model":"chat-1","stream":true,"messages":[{"role":"user","content":"hi"}]})";

// `payloads` framed as one chunk each, with the terminal chunk after them
// (unless `terminal` is false).
std::string chunked(const std::vector<std::string>& payloads, bool terminal = true);
// The payload of a chunked body. Returns: whether the body is well framed
// and ends with the terminal chunk.
bool dechunk(std::string_view body, std::string& payload);
// The data of each SSE event of `payload` (LF or CRLF line ends).
std::vector<std::string> sse_data(std::string_view payload);
// A response head with the given status line, fields and the empty line.
std::string response_head(std::string_view status_line, std::string_view fields);
inline const std::string k_sse_head =
    response_head("200 OK", "content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n");

// The request head and body a backend got.
struct parsed_request {
  std::string request_line;
  std::vector<std::pair<std::string, std::string>> fields;
  std::string body;
  explicit parsed_request(std::string_view raw);
  std::vector<std::string> values(std::string_view name) const;
  std::string value(std::string_view name) const;
};

// A JSON document, parsed whole (REQUIREs it is one).
struct json {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  explicit json(std::string_view text);
};
std::string str(simdjson::dom::element e);

}  // namespace sluice::adapters_test
