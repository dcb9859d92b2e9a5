// The fixture of the adapters' tests: the scripted backend, the shard with
// its two adapters, and the byte helpers (see adapter_fixture.hpp).
#include "adapter_fixture.hpp"

#include <arpa/inet.h>
#include <fcntl.h>

#include <cstring>

namespace sluice::adapters_test {

int open_fds() {
  DIR* d = ::opendir("/proc/self/fd");
  REQUIRE(d != nullptr);
  int n = 0;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n - 1;  // the directory's own
}

// --- scripted_backend ------------------------------------------------------------

scripted_backend::scripted_backend(bool listening) {
  listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  REQUIRE(listen_fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listen_fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  if (listening) REQUIRE(::listen(listen_fd, 16) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  port = ntohs(a.sin_port);
}

bool scripted_backend::try_accept() {
  const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return false;
  // Each scripted write goes at once, not after the last one's ACK (Nagle).
  const int one = 1;
  REQUIRE(::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0);
  conns.push_back(fd);
  inbox.emplace_back();
  return true;
}

bool scripted_backend::try_request(size_t conn, std::string& out) {
  REQUIRE(conn < conns.size());
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(conns[conn], buf, sizeof buf, 0);
    if (n <= 0) break;
    inbox[conn].append(buf, static_cast<size_t>(n));
  }
  const std::string& in = inbox[conn];
  const size_t head_end = in.find("\r\n\r\n");
  if (head_end == std::string::npos) return false;
  size_t body_len = 0;
  std::string head = in.substr(0, head_end + 2);
  for (char& ch : head) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const size_t cl = head.find("\r\ncontent-length:");
  if (cl != std::string::npos) body_len = std::strtoul(head.c_str() + cl + 17, nullptr, 10);
  const size_t total = head_end + 4 + body_len;
  if (in.size() < total) return false;
  out = in.substr(0, total);
  inbox[conn].erase(0, total);
  return true;
}

bool scripted_backend::peer_closed(size_t conn) {
  REQUIRE(conn < conns.size());
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(conns[conn], buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
    inbox[conn].append(buf, static_cast<size_t>(n));
  }
}

void scripted_backend::write(size_t conn, std::string_view bytes) {
  REQUIRE(conn < conns.size());
  // Loopback takes a few KiB at once: a short write would be a test's bug.
  const ssize_t n = ::send(conns[conn], bytes.data(), bytes.size(), MSG_NOSIGNAL);
  REQUIRE(n == static_cast<ssize_t>(bytes.size()));
}

void scripted_backend::reset(size_t conn) {
  const linger l{1, 0};
  REQUIRE(::setsockopt(conns[conn], SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0);
  close_conn(conn);
}

void scripted_backend::close_conn(size_t conn) {
  if (conns[conn] >= 0) ::close(conns[conn]);
  conns[conn] = -1;
}

void scripted_backend::close_all() {
  for (size_t i = 0; i < conns.size(); ++i) close_conn(i);
  if (listen_fd >= 0) ::close(listen_fd);
  listen_fd = -1;
}

// --- shard_parts -----------------------------------------------------------------

shard_parts make_shard_parts(std::string_view groups, std::string_view tag, const std::vector<std::string>& urls) {
  std::string text = "[server]\nupstream_buffers = 8\n[audit]\npath = \"\"\n";
  text += groups;
  text += "\n[[key]]\nid = \"k\"\nkey = \"sk-client\"\n";
  for (size_t i = 0; i < urls.size(); ++i) {
    std::string t(1, '{');
    t.append(tag).append(std::to_string(i)).push_back('}');
    for (size_t at = text.find(t); at != std::string::npos; at = text.find(t)) text.replace(at, t.size(), urls[i]);
  }
  shard_parts p;
  p.config = config::load(text, "adapters_test.toml", config::flags{});
  p.ring = shard::reactor::create({});
  REQUIRE(p.ring != nullptr);
  metrics::registry::names n;
  for (const auto& g : p.config->groups) n.groups.push_back(g.name);
  for (const auto& b : p.config->backends) n.backends.push_back(b.url);
  for (const auto& k : p.config->keys) n.keys.push_back(k.id);
  p.registry = std::make_unique<metrics::registry>(1, std::move(n));
  p.ctx = std::make_unique<proxy::shard_context>(0, p.config, *p.ring, p.registry->shard(0), 1);
  return p;
}

// --- shard_fixture ---------------------------------------------------------------

shard_fixture::shard_fixture(std::string_view groups, std::vector<bool> listening) {
  for (const bool l : listening) backends.push_back(std::make_unique<scripted_backend>(l));
  std::vector<std::string> urls;
  for (const auto& b : backends) urls.push_back(b->url());
  shard_parts parts = make_shard_parts(groups, "b", urls);
  config = std::move(parts.config);
  ring = std::move(parts.ring);
  registry = std::move(parts.registry);
  ctx = std::move(parts.ctx);
  http = std::make_unique<proxy::openai_http>(*ctx, policy);
  REQUIRE(http->init());
  anthropic = std::make_unique<proxy::anthropic_http>(*ctx, *http);
  fds_after_setup = open_fds();
}

shard_fixture::~shard_fixture() {
  // Whatever is still out is let go: sends given back, attempts cut; then
  // every backend socket closes, which ends the receive each upstream
  // connection keeps armed (pooled ones too), and the turns run until each
  // connection is freed (its fd closed).
  for (auto& c : calls) {
    if (c->codec.pin != nullptr) c->codec.pin->give_back(c->codec.pin);
    c->codec.send_for = nullptr;
    c->codec.pin = nullptr;
  }
  for (auto& c : calls) {
    if (c->x.up != nullptr) http->release(c->x);
  }
  for (auto& b : backends) b->close_all();
  const int want = fds_after_setup - static_cast<int>(backends.size());
  CHECK(pump([&] { return open_fds() == want; }));
}

uint32_t shard_fixture::backend_index(size_t i) const {
  const std::string url = backends[i]->url();
  for (uint32_t k = 0; k < config->backends.size(); ++k) {
    if (config->backends[k].url == url) return k;
  }
  FAIL("no such backend");
  return 0;
}

call& start_call(std::vector<std::unique_ptr<call>>& calls, std::string_view body, const call_options& o,
                 proxy::backend_adapter* adapter, openai::request_reader& reader, uint64_t now_ms) {
  calls.push_back(std::make_unique<call>());
  call& c = *calls.back();
  c.request_id = "req-" + std::to_string(calls.size());
  c.head_bytes = "POST " + o.path + (o.http10 ? " HTTP/1.0" : " HTTP/1.1") +
                 "\r\nhost: sluice.test\r\ncontent-type: application/json\r\ncontent-length: " +
                 std::to_string(body.size()) + "\r\n" + o.headers + "\r\n";
  c.codec.body = std::string(body) + std::string(simdjson::SIMDJSON_PADDING, '\0');
  c.codec.body_len = body.size();
  c.codec.chunked_client = !o.http10;
  exchange& x = c.x;
  x.codec = &c.codec;
  x.mem = &c.mem;
  x.adapter = adapter;
  REQUIRE(c.parser.parse_head(c.head_bytes.data(), c.head_bytes.size(), x.head).ok());
  x.head_ok = true;
  std::memcpy(x.request_id, c.request_id.data(), c.request_id.size());
  x.request_id_len = static_cast<uint8_t>(c.request_id.size());
  x.req.endpoint = o.path == "/v1/completions" ? openai::endpoint::completions
                   : o.path == "/v1/embeddings" ? openai::endpoint::embeddings
                                                : openai::endpoint::chat_completions;
  openai::request_fields f;
  openai::request_error e;
  CAPTURE(e.message);
  REQUIRE(reader.read(x.req.endpoint, c.codec.body.data(), c.codec.body_len, 1 << 20, f, e));
  x.req.model_len = static_cast<uint8_t>(f.model.size());
  std::memcpy(x.req.model, f.model.data(), f.model.size());
  x.req.is_stream = f.stream;
  if (o.speaks != dialect::client_dialect::chat) {
    x.req.speaks = o.speaks;
    x.req.body = std::string_view(c.codec.body.data(), c.codec.body_len);
  }
  x.group = o.group;
  x.route_key.pinned = o.pinned;
  x.start_wall_ms = 1700000000000;
  x.request_start_ms = now_ms;
  if (x.adapter->prepare(x, f)) x.adapter->start(x);
  return c;
}

call& shard_fixture::start(std::string_view body, const call_options& o, proxy::backend_adapter* adapter) {
  return start_call(calls, body, o, adapter != nullptr ? adapter : http.get(), reader, ring->now_ms());
}

void complete_sends(std::vector<std::unique_ptr<call>>& calls) {
  for (auto& c : calls) {
    if (c->codec.send_for != nullptr) c->codec.complete_send();
  }
}

void shard_fixture::complete_sends() { adapters_test::complete_sends(calls); }

bool shard_fixture::settled(const call& c) {
  if (c.codec.send_for != nullptr) return false;
  if (c.codec.ended()) return true;
  const proxy::upstream_conn* u = c.x.up;
  if (u == nullptr) return false;
  int queued = 0;
  REQUIRE(::ioctl(u->fd, FIONREAD, &queued) == 0);
  return queued == 0 && io_uring_cq_ready(ring->ring()) == 0;
}

void shard_fixture::write_settled(call& c, size_t conn, std::string_view bytes) {
  backend().write(conn, bytes);
  REQUIRE(pump([&] { return settled(c); }));
}

size_t shard_fixture::await_request(size_t backend_i, std::string& req) {
  scripted_backend& b = *backends[backend_i];
  size_t got = SIZE_MAX;
  REQUIRE(pump([&] {
    while (b.try_accept()) {
    }
    for (size_t i = 0; i < b.conns.size(); ++i) {
      if (b.conns[i] >= 0 && b.try_request(i, req)) {
        got = i;
        return true;
      }
    }
    return false;
  }));
  return got;
}

std::string shard_fixture::serve(call& c, const std::vector<std::string>& pieces, size_t backend_i) {
  std::string req;
  last_conn = await_request(backend_i, req);
  for (const std::string& p : pieces) {
    backends[backend_i]->write(last_conn, p);
    REQUIRE(pump([&] { return settled(c); }));
  }
  return req;
}

// --- bytes -----------------------------------------------------------------------

std::string chunked(const std::vector<std::string>& payloads, bool terminal) {
  std::string out;
  char size[32];
  for (const std::string& p : payloads) {
    std::snprintf(size, sizeof size, "%zx\r\n", p.size());
    out += size;
    out += p;
    out += "\r\n";
  }
  if (terminal) out += "0\r\n\r\n";
  return out;
}

bool dechunk(std::string_view body, std::string& payload) {
  payload.clear();
  size_t at = 0;
  for (;;) {
    const size_t eol = body.find("\r\n", at);
    if (eol == std::string_view::npos || eol == at) return false;
    size_t n = 0;
    for (size_t i = at; i < eol && body[i] != ';'; ++i) {
      const char ch = body[i];
      const int digit = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                                                        : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
      if (digit < 0) return false;
      n = n * 16 + static_cast<size_t>(digit);
    }
    at = eol + 2;
    if (n == 0) return body.substr(at) == "\r\n";
    if (body.size() < at + n + 2 || body.substr(at + n, 2) != "\r\n") return false;
    payload.append(body.substr(at, n));
    at += n + 2;
  }
}

std::vector<std::string> sse_data(std::string_view payload) {
  std::vector<std::string> events;
  std::string data;
  bool has_data = false;
  size_t at = 0;
  while (at < payload.size()) {
    size_t eol = payload.find('\n', at);
    if (eol == std::string_view::npos) break;  // an unended line is no event
    std::string_view line = payload.substr(at, eol - at);
    at = eol + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {
      if (has_data) events.push_back(data);
      data.clear();
      has_data = false;
      continue;
    }
    if (line.starts_with("data:")) {
      line.remove_prefix(5);
      if (line.starts_with(' ')) line.remove_prefix(1);
      if (has_data) data += '\n';
      data.append(line);
      has_data = true;
    }
  }
  return events;
}

std::string response_head(std::string_view status_line, std::string_view fields) {
  return "HTTP/1.1 " + std::string(status_line) + "\r\n" + std::string(fields) + "\r\n";
}

parsed_request::parsed_request(std::string_view raw) {
  const size_t head_end = raw.find("\r\n\r\n");
  REQUIRE(head_end != std::string_view::npos);
  body = std::string(raw.substr(head_end + 4));
  std::string_view head = raw.substr(0, head_end + 2);
  size_t eol = head.find("\r\n");
  request_line = std::string(head.substr(0, eol));
  for (size_t at = eol + 2; at < head.size(); at = eol + 2) {
    eol = head.find("\r\n", at);
    const std::string_view line = head.substr(at, eol - at);
    const size_t colon = line.find(':');
    REQUIRE(colon != std::string_view::npos);
    std::string_view value = line.substr(colon + 1);
    while (value.starts_with(' ')) value.remove_prefix(1);
    std::string name(line.substr(0, colon));
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    fields.emplace_back(std::move(name), std::string(value));
  }
}

std::vector<std::string> parsed_request::values(std::string_view name) const {
  std::vector<std::string> out;
  for (const auto& [n, v] : fields) {
    if (n == name) out.push_back(v);
  }
  return out;
}

std::string parsed_request::value(std::string_view name) const {
  const std::vector<std::string> v = values(name);
  if (v.size() == 1) return v[0];
  std::string none("<values: ");
  none += std::to_string(v.size());
  none += '>';
  return none;
}

json::json(std::string_view text) { REQUIRE(parser.parse(text.data(), text.size()).get(root) == simdjson::SUCCESS); }

std::string str(simdjson::dom::element e) {
  std::string_view s;
  if (e.get_string().get(s) != simdjson::SUCCESS) return "<not a string>";
  return std::string(s);
}

}  // namespace sluice::adapters_test
