#pragma once
// Test support for tests/unit/client: one shard's client side -- the
// client transport with the HTTP/1.1 and HTTP/2 codecs on it, as
// shard_server wires them -- on a real reactor and a listener on 127.0.0.1 port 0, with a fake
// policy and a fake backend adapter that record every call. The test's
// clients are plain loopback sockets; the loop is turned until what a test
// waits for holds (bounded turns, never a sleep).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend_adapter.hpp"
#include "exchange.hpp"
#include "exchange_policy.hpp"
#include "client_transport.hpp"
#include "h1_codec.hpp"
#include "h2_codec.hpp"
#include "shard_context.hpp"
#include "sluice/config/config.hpp"
#include "sluice/http/response.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/net/socket.hpp"
#include "sluice/shard/reactor.hpp"

namespace codec_test {

namespace proxy = sluice::proxy;
using proxy::exchange;

// Small head limits, so a too-large head is a few KiB of test input.
inline constexpr std::string_view k_config = R"(
[server]
listen = "127.0.0.1:0"
max_head_bytes = 4096
max_line_bytes = 2048
max_body_bytes = 1048576
[audit]
path = ""
[[group]]
name = "g"
models = ["*"]
backends = ["http://127.0.0.1:9"]
[[key]]
id = "k"
key = "k"
)";

// What a request looked like when the policy saw it.
struct seen_request {
  std::string method, path, body;
  bool has_body = false;
};

// A backend attempt that answers when the test says so, through the
// exchange's codec as a real adapter does: the head staged, the stream
// waited on, the body's pieces sent one per completion, then the end.
struct fake_adapter final : proxy::backend_adapter {
  exchange* x = nullptr;  // the attempt out (null: none)
  int started = 0;
  int released = 0;       // release() of an attempt still out (the client went)
  int on_sent_calls = 0;
  std::string head_bytes;
  sluice::http::response_parser parser;
  sluice::http::response_head head;
  std::deque<std::string> pieces;  // a deque: a piece being sent stays where it is as more come
  size_t next = 0;
  bool end = false;       // response_done once every piece went
  bool sending = false;
  proxy::buffer_lender* lender = nullptr;  // lent with each piece (null: none)

  bool prepare(exchange&, const sluice::openai::request_fields&) noexcept override { return true; }
  void start(exchange& e) noexcept override {
    ++started;
    x = &e;
    e.codec->wait_for_backend(e, proxy::deadline_kind::none, 0);
  }
  void release(exchange& e) noexcept override {
    // Every close of a connection calls it, idle or not: only an attempt
    // still out counts.
    if (&e != x) return;
    ++released;
    x = nullptr;
  }
  void on_timeout(exchange&) noexcept override {}
  void on_sent(exchange& e) noexcept override {
    ++on_sent_calls;
    sending = false;
    go_on(e);
  }

  // The backend's head (whole, with its empty line) and the first pieces
  // of its body; `last`: the body ends with them.
  void respond(std::string_view backend_head, std::vector<std::string> body, bool last) {
    REQUIRE(x != nullptr);
    head_bytes = std::string(backend_head);
    parser.reset();
    REQUIRE(parser.parse_head(head_bytes.data(), head_bytes.size(), head).ok());
    // As openai_http does: the stream is waited on, the head staged, the
    // exchange's status is the backend's.
    x->codec->stream_wait(*x, 0);
    REQUIRE(x->codec->stage_response_head(*x, head, false));
    x->status = head.status;
    x->response_started = true;
    pieces.assign(body.begin(), body.end());
    next = 0;
    end = last;
    const iovec first{pieces.empty() ? nullptr : pieces[0].data(), pieces.empty() ? 0 : pieces[0].size()};
    if (!pieces.empty()) next = 1;
    sending = true;
    x->codec->send_response(*x, true, &first, pieces.empty() ? 0 : 1, lender, 0);
  }
  // More of the body (the backend sent on); `last` as above.
  void more(std::vector<std::string> body, bool last) {
    REQUIRE(x != nullptr);
    for (auto& p : body) pieces.push_back(std::move(p));
    end = last;
    if (!sending) go_on(*x);
  }

 private:
  void go_on(exchange& e) {
    if (next < pieces.size()) {
      const iovec piece{pieces[next].data(), pieces[next].size()};
      ++next;
      sending = true;
      e.codec->send_response(e, false, &piece, 1, lender, 0);
      return;
    }
    if (!end) return;
    x = nullptr;  // the exchange is over: the codec may reset it in place
    e.codec->response_done(e);
  }
};

// The policy: records each call and checks the accounting contract as it
// goes (end_request once per open_request, never without one). What it
// does with a request is the test's: accept_head and dispatch hooks; by
// default every head is accepted and every request answered 200 with a
// body naming its order.
struct fake_policy final : proxy::exchange_policy {
  fake_adapter* adapter_of_all = nullptr;
  std::function<bool(exchange&, bool)> on_head;  // null: accept
  std::function<void(exchange&)> on_dispatch;     // null: answer 200
  std::vector<seen_request> heads, dispatched;
  int opened = 0, ended = 0, cancels = 0, unparks = 0;
  int contract_breaks = 0;  // an open of an open exchange, an end of a closed one
  int ids = 0;

  int open_now() const { return opened - ended; }

  void open_request(exchange& x) noexcept override {
    if (x.request_open) ++contract_breaks;
    x.request_open = true;
    ++opened;
  }
  void make_request_id(exchange& x) noexcept override {
    const std::string id = "req-" + std::to_string(++ids);
    std::memcpy(x.request_id, id.data(), id.size());
    x.request_id_len = static_cast<uint8_t>(id.size());
  }
  bool accept_head(exchange& x, bool has_body) noexcept override {
    heads.push_back({std::string(x.head.method_name), std::string(x.head.path), {}, has_body});
    return on_head ? on_head(x, has_body) : true;
  }
  void dispatch(exchange& x) noexcept override {
    dispatched.push_back(
        {std::string(x.head.method_name), std::string(x.head.path), std::string(x.codec->request_body(x)), false});
    if (on_dispatch) {
      on_dispatch(x);
      return;
    }
    answer_ok(x);
  }
  // 200 with a body that says which dispatch this was.
  void answer_ok(exchange& x) {
    const std::string body = "{\"n\":" + std::to_string(dispatched.size()) + "}";
    x.codec->answer(x, 200, body, false, {}, {});
  }
  size_t write_response_headers(const exchange&, char* out, size_t cap) noexcept override {
    constexpr std::string_view f = "x-fake-policy: 1\r\n";
    if (cap < f.size()) return 0;
    std::memcpy(out, f.data(), f.size());
    return f.size();
  }
  void cancel(exchange& x) noexcept override {
    ++cancels;
    x.cancelled = true;
    x.status = 499;
    x.error_code = "client_closed";
  }
  void unpark(exchange& x) noexcept override {
    ++unparks;
    x.waiting = exchange::waiting_in::none;
  }
  void end_request(exchange& x) noexcept override {
    if (!x.request_open) ++contract_breaks;
    x.request_open = false;
    ++ended;
  }
  proxy::backend_adapter* adapter() noexcept override { return adapter_of_all; }
  void report_outcome(uint32_t, bool) noexcept override {}
  void fair_progress(exchange&) noexcept override {}
  void keep_route(exchange&, uint32_t, std::string_view) noexcept override {}
  void keep_response(exchange&) noexcept override {}
};

// A buffer_lender that counts its buffer's returns.
struct counting_lender : proxy::buffer_lender {
  int given_back = 0;
  counting_lender() {
    give_back = [](proxy::buffer_lender* self) noexcept { ++static_cast<counting_lender*>(self)->given_back; };
  }
};

// One response as the client read it.
struct response {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
};

// The test's end of a connection: a non-blocking loopback socket and the
// bytes it has read.
struct client_conn {
  int fd = -1;
  std::string received;
  bool eof = false;  // the server closed (or reset) its side

  client_conn() = default;
  client_conn(const client_conn&) = delete;
  client_conn& operator=(const client_conn&) = delete;
  ~client_conn() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  // Reads what is there without waiting.
  void read_some() {
    if (fd < 0 || eof) return;
    char buf[16384];
    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        received.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) eof = true;
      return;
    }
  }
  // Every whole response read so far (1xx ones too, with no body), in order.
  std::vector<response> responses() const;
};

inline std::vector<response> client_conn::responses() const {
  std::vector<response> out;
  size_t at = 0;
  for (;;) {
    const size_t end = received.find("\r\n\r\n", at);
    if (end == std::string::npos) return out;
    response r;
    const std::string head = received.substr(at, end - at);
    REQUIRE(head.rfind("HTTP/1.1 ", 0) == 0);
    r.status = std::stoi(head.substr(9, 3));
    size_t line = head.find("\r\n");
    while (line != std::string::npos) {
      const size_t next = head.find("\r\n", line + 2);
      const std::string l = head.substr(line + 2, next == std::string::npos ? std::string::npos : next - line - 2);
      const size_t colon = l.find(':');
      REQUIRE(colon != std::string::npos);
      std::string name = l.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const size_t v = l.find_first_not_of(' ', colon + 1);
      r.headers[name] = v == std::string::npos ? "" : l.substr(v);
      line = next;
    }
    size_t pos = end + 4;
    if (r.status >= 100 && r.status < 200) {
      out.push_back(std::move(r));
      at = pos;
      continue;
    }
    if (r.headers.count("content-length") != 0) {
      const size_t n = std::stoul(r.headers["content-length"]);
      if (received.size() < pos + n) return out;
      r.body = received.substr(pos, n);
      pos += n;
    } else if (r.headers["transfer-encoding"] == "chunked") {
      for (;;) {
        const size_t le = received.find("\r\n", pos);
        if (le == std::string::npos) return out;
        const size_t n = std::stoul(received.substr(pos, le - pos), nullptr, 16);
        if (received.size() < le + 2 + n + 2) return out;
        r.body += received.substr(le + 2, n);
        pos = le + 2 + n + 2;
        if (n == 0) break;
      }
    } else {
      if (!eof) return out;  // close-delimited: whole at the close
      r.body = received.substr(pos);
      pos = received.size();
    }
    out.push_back(std::move(r));
    at = pos;
  }
}

// A shard's loop and a listener on 127.0.0.1 port 0, and the test's
// clients; what runs on the loop is the derived fixture's (iterate).
struct loop_fixture {
  std::shared_ptr<const sluice::config::config> config;
  std::unique_ptr<sluice::shard::reactor> ring = sluice::shard::reactor::create({});
  std::unique_ptr<sluice::metrics::registry> metrics;
  std::unique_ptr<proxy::shard_context> ctx;
  int listen_fd = -1;  // the derived fixture's transport takes it
  uint16_t port = 0;
  std::vector<std::unique_ptr<client_conn>> clients;

  explicit loop_fixture(std::string_view toml) {
    config = sluice::config::load(toml, "client_test.toml", sluice::config::flags{});
    REQUIRE(ring != nullptr);
    sluice::metrics::registry::names n;
    for (const auto& g : config->groups) n.groups.push_back(g.name);
    for (const auto& b : config->backends) n.backends.push_back(b.url);
    for (const auto& k : config->keys) n.keys.push_back(k.id);
    metrics = std::make_unique<sluice::metrics::registry>(1, std::move(n));
    ctx = std::make_unique<proxy::shard_context>(0, config, *ring, metrics->shard(0), 1);
    const sluice::config::socket_address& la = config->server.listen;
    listen_fd = sluice::net::listen_socket(reinterpret_cast<const sockaddr*>(&la.storage), la.length, false);
    REQUIRE(listen_fd >= 0);
    port = sluice::net::local_port(listen_fd);
    REQUIRE(port != 0);
  }
  virtual ~loop_fixture() = default;
  loop_fixture(const loop_fixture&) = delete;
  loop_fixture& operator=(const loop_fixture&) = delete;

  // The parts' work of one loop turn, as shard_server's hook does it.
  virtual void iterate(uint64_t now_ms) = 0;
  // One turn of the shard's loop.
  void turn() {
    ring->run_once(10);
    iterate(ring->now_ms());
    for (auto& c : clients) c->read_some();
  }
  // Turns the loop until `done` holds. Returns: whether it did.
  template <class F>
  bool run_until(F done, int turns = 1000) {
    for (int i = 0; i < turns; ++i) {
      if (done()) return true;
      turn();
    }
    return done();
  }
  // Closes every client and turns the loop until the server has freed
  // their connections (the derived fixture's destructor, before its parts go).
  template <class F>
  void close_all(F connections) {
    for (auto& c : clients) c->close();
    for (int i = 0; i < 500 && connections() != 0; ++i) turn();
  }

  client_conn& connect() {
    const uint64_t before = accepted();
    client_conn& made = connect_raw();
    // Accepted (counted; another connection may close meanwhile).
    REQUIRE(run_until([&] { return accepted() > before; }));
    return made;
  }
  // A connection the server may refuse (nothing waited for).
  client_conn& connect_raw() {
    auto c = std::make_unique<client_conn>();
    c->fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(c->fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(c->fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::fcntl(c->fd, F_SETFL, O_NONBLOCK) == 0);
    clients.push_back(std::move(c));
    return *clients.back();
  }
  uint64_t accepted() const { return metrics->shard(0).at(sluice::metrics::stat::connections_accepted).get(); }
  // Writes all of `bytes`, turning the loop while the socket is full.
  void send(client_conn& c, std::string_view bytes) {
    size_t off = 0;
    bool failed = false;
    for (int turns = 0; off < bytes.size() && !failed && turns < 10000; ++turns) {
      const ssize_t n = ::send(c.fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<size_t>(n);
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        turn();  // the socket is full until the server reads
      } else {
        failed = true;
      }
    }
    REQUIRE(off == bytes.size());
  }
  // Turns the loop until `c` has `n` whole responses (or the test fails).
  std::vector<response> responses(client_conn& c, size_t n) {
    REQUIRE(run_until([&] { return c.responses().size() >= n; }));
    return c.responses();
  }
  bool closed_by_server(client_conn& c) {
    return run_until([&] {
      c.read_some();
      return c.eof;
    });
  }
};

// One shard's client side: the transport with the HTTP/1.1 and HTTP/2
// codecs on it, a fake policy and a fake adapter.
struct shard_fixture : loop_fixture {
  fake_adapter adapter;
  fake_policy policy;
  std::unique_ptr<proxy::client_transport> transport;
  std::unique_ptr<proxy::h1_codec> h1;
  std::unique_ptr<proxy::h2_codec> h2;

  explicit shard_fixture(std::string_view toml = k_config) : loop_fixture(toml) {
    policy.adapter_of_all = &adapter;
    // As shard_server wires them: the transport owns the connections and
    // hands each to HTTP/1.1, or to HTTP/2 when it speaks the preface.
    transport = std::make_unique<proxy::client_transport>(*ctx, listen_fd, -1);
    h1 = std::make_unique<proxy::h1_codec>(*ctx, policy, *transport);
    h2 = std::make_unique<proxy::h2_codec>(*ctx, policy, *transport);
    transport->set_protocols(h1.get(), h2.get());
    REQUIRE(transport->init());
  }
  ~shard_fixture() override {
    // Every connection closes and is freed before the codecs go (an HTTP/2
    // connection's streams are freed only through its close); then the
    // codecs and the transport, then the ring.
    close_all([&] { return transport->connection_count(); });
    h2.reset();
    h1.reset();
    transport.reset();
  }
  void iterate(uint64_t now) override {
    transport->on_iteration(now);
    h2->on_iteration(now);
  }
};

inline std::string post(std::string_view path, std::string_view body, std::string_view extra = {}) {
  return "POST " + std::string(path) + " HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\n" +
         std::string(extra) + "content-length: " + std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
}
inline std::string get(std::string_view path, std::string_view extra = {}) {
  return "GET " + std::string(path) + " HTTP/1.1\r\nhost: sluice\r\n" + std::string(extra) + "\r\n";
}

}  // namespace codec_test
