#pragma once
// Test support for tests/unit/h2: an owner that records every event, an
// in-process nghttp2 client session, the pump that moves bytes both ways,
// and hand-made frames for the input a well-behaved client never sends.
#include <doctest/doctest.h>
#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "sluice/h2/session.hpp"

namespace h2_test {

namespace h2 = sluice::h2;

struct server_stream {
  std::string method, scheme, authority, path;
  std::string target, http_path, authorization, session_id, content_type, host, field_lines, expect;
  sluice::http::method meth = sluice::http::method::other;
  bool has_content_length = false;
  uint64_t content_length = 0;
  bool expect_continue = false;
  uint16_t header_count = 0;
  std::vector<std::pair<std::string, std::string>> fields;
  bool end_at_head = false;
  std::string body;
  std::vector<size_t> data_pieces;
  bool body_ended = false;
  int drained = 0;
  bool closed = false;
  h2::close_cause cause = h2::close_cause::done;
  uint32_t code = 0;
};

struct recording_owner : h2::session_owner {
  h2::server_session* session = nullptr;
  std::map<int32_t, server_stream> streams;
  std::vector<int32_t> head_order;
  std::vector<std::pair<uint32_t, bool>> goaways;
  bool consume_body = true;
  std::function<void(const h2::request&)> answer;  // called after the head is recorded

  void on_request_head(const h2::request& r) override {
    server_stream& s = streams[r.stream_id];
    s.method = r.method;
    s.scheme = r.scheme;
    s.authority = r.authority;
    s.path = r.path;
    s.target = r.head.target;
    s.http_path = r.head.path;
    s.meth = r.head.meth;
    s.authorization = r.head.authorization;
    s.session_id = r.head.session_id;
    s.content_type = r.head.content_type;
    s.host = r.head.host;
    s.field_lines = r.head.field_lines;
    s.expect = r.expect;
    s.expect_continue = r.head.expect_continue;
    s.has_content_length = r.head.has_content_length;
    s.content_length = r.head.content_length;
    s.header_count = r.head.header_count;
    s.end_at_head = r.end_stream;
    sluice::http::header f;
    auto it = r.head.fields();
    while (it.next(f)) s.fields.emplace_back(std::string(f.name), std::string(f.value));
    head_order.push_back(r.stream_id);
    if (answer) answer(r);
  }
  void on_request_data(int32_t id, std::span<const char> bytes, bool end_stream) override {
    server_stream& s = streams[id];
    s.body.append(bytes.data(), bytes.size());
    if (!bytes.empty()) s.data_pieces.push_back(bytes.size());
    if (end_stream) s.body_ended = true;
    if (consume_body && !bytes.empty()) session->consume(id, bytes.size());
  }
  void on_body_drained(int32_t id) override { ++streams[id].drained; }
  void on_stream_closed(int32_t id, h2::close_cause cause, uint32_t code) override {
    server_stream& s = streams[id];
    CHECK_FALSE(s.closed);
    s.closed = true;
    s.cause = cause;
    s.code = code;
  }
  void on_goaway(uint32_t code, bool from_client) override { goaways.emplace_back(code, from_client); }
};

// The client's view of one stream.
struct client_stream {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::vector<std::string> never_indexed;  // names the server sent as "never indexed" literals
  std::string body;
  std::vector<size_t> data_frames;  // DATA payload sizes, in order
  bool end_stream = false;
  bool closed = false;
  uint32_t close_code = 0;
};

// A request body the client sends from memory.
struct client_body {
  std::string bytes;
  size_t off = 0;
};

class client {
 public:
  // `window_bytes`: the client's SETTINGS_INITIAL_WINDOW_SIZE; with
  // manual_window the test gives it back with consume().
  explicit client(uint32_t window_bytes = 65535, bool manual_window = false) {
    nghttp2_session_callbacks* cbs = nullptr;
    REQUIRE(nghttp2_session_callbacks_new(&cbs) == 0);
    nghttp2_session_callbacks_set_on_header_callback(cbs, &on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &on_data);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &on_frame);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &on_close);
    nghttp2_option* opt = nullptr;
    REQUIRE(nghttp2_option_new(&opt) == 0);
    if (manual_window) nghttp2_option_set_no_auto_window_update(opt, 1);
    REQUIRE(nghttp2_session_client_new2(&_s, cbs, this, opt) == 0);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    const nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, window_bytes}};
    REQUIRE(nghttp2_submit_settings(_s, NGHTTP2_FLAG_NONE, iv, 1) == 0);
  }
  ~client() { nghttp2_session_del(_s); }
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  nghttp2_session* native() { return _s; }

  // Returns: the new stream's id.
  int32_t request(std::string_view method, std::string_view path,
                  std::vector<std::pair<std::string, std::string>> extra = {}, client_body* body = nullptr) {
    std::vector<std::pair<std::string, std::string>> h = {
        {":method", std::string(method)}, {":scheme", "https"}, {":authority", "gw.example"},
        {":path", std::string(path)}};
    for (auto& e : extra) h.push_back(std::move(e));
    std::vector<nghttp2_nv> nva;
    for (auto& [n, v] : h)
      nva.push_back({reinterpret_cast<uint8_t*>(n.data()), reinterpret_cast<uint8_t*>(v.data()), n.size(),
                     v.size(), NGHTTP2_NV_FLAG_NONE});
    nghttp2_data_provider prd;
    prd.source.ptr = body;
    prd.read_callback = &read_body;
    const int32_t id = nghttp2_submit_request(_s, nullptr, nva.data(), nva.size(), body ? &prd : nullptr, nullptr);
    REQUIRE(id > 0);
    streams[id];
    return id;
  }

  // Returns: bytes the client wants to send (one mem_send chunk), empty at the end.
  std::string take_output() {
    std::string out;
    for (;;) {
      const uint8_t* p = nullptr;
      const ssize_t n = nghttp2_session_mem_send(_s, &p);
      REQUIRE(n >= 0);
      if (n == 0) break;
      out.append(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
    }
    return out;
  }

  void receive(std::span<const char> bytes) {
    const ssize_t n = nghttp2_session_mem_recv(_s, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    REQUIRE(n == static_cast<ssize_t>(bytes.size()));
  }

  std::map<int32_t, client_stream> streams;
  bool goaway = false;
  uint32_t goaway_code = 0;
  size_t data_bytes = 0;

 private:
  static client& self(void* p) { return *static_cast<client*>(p); }
  static int on_header(nghttp2_session*, const nghttp2_frame* f, const uint8_t* n, size_t nl, const uint8_t* v,
                       size_t vl, uint8_t flags, void* ud) {
    client_stream& s = self(ud).streams[f->hd.stream_id];
    std::string name(reinterpret_cast<const char*>(n), nl), value(reinterpret_cast<const char*>(v), vl);
    if ((flags & NGHTTP2_NV_FLAG_NO_INDEX) != 0) s.never_indexed.push_back(name);
    if (name == ":status") s.status = std::stoi(value);
    else s.headers.emplace_back(name, value);
    return 0;
  }
  static int on_data(nghttp2_session*, uint8_t, int32_t id, const uint8_t* d, size_t len, void* ud) {
    self(ud).streams[id].body.append(reinterpret_cast<const char*>(d), len);
    self(ud).data_bytes += len;
    return 0;
  }
  static int on_frame(nghttp2_session*, const nghttp2_frame* f, void* ud) {
    client& c = self(ud);
    if (f->hd.type == NGHTTP2_GOAWAY) {
      c.goaway = true;
      c.goaway_code = f->goaway.error_code;
    }
    if (f->hd.type == NGHTTP2_DATA) c.streams[f->hd.stream_id].data_frames.push_back(f->hd.length);
    if ((f->hd.type == NGHTTP2_DATA || f->hd.type == NGHTTP2_HEADERS) && (f->hd.flags & NGHTTP2_FLAG_END_STREAM))
      c.streams[f->hd.stream_id].end_stream = true;
    return 0;
  }
  static int on_close(nghttp2_session*, int32_t id, uint32_t code, void* ud) {
    client_stream& s = self(ud).streams[id];
    s.closed = true;
    s.close_code = code;
    return 0;
  }
  static ssize_t read_body(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* flags,
                           nghttp2_data_source* src, void*) {
    auto* b = static_cast<client_body*>(src->ptr);
    const size_t n = std::min(length, b->bytes.size() - b->off);
    std::memcpy(buf, b->bytes.data() + b->off, n);
    b->off += n;
    if (b->off == b->bytes.size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return static_cast<ssize_t>(n);
  }

  nghttp2_session* _s = nullptr;
};

// Moves bytes both ways until neither side has any. The server's output
// goes over in pieces of at most `chunk` bytes (a socket's sends).
inline void pump(client& c, h2::server_session& s, uint64_t now_ms = 0, size_t chunk = 1 << 20) {
  for (int round = 0; round < 10000; ++round) {
    bool moved = false;
    const std::string out = c.take_output();
    if (!out.empty()) {
      moved = true;
      s.feed(out, now_ms);
    }
    while (s.has_output()) {
      auto v = s.pending_output();
      const size_t n = std::min(v.size(), chunk);
      c.receive(v.first(n));
      s.consume_output(n);
      moved = true;
    }
    if (!moved) return;
  }
  FAIL("pump did not settle");
}

// --- hand-made frames ----------------------------------------------------------------

inline std::string frame(uint8_t type, uint8_t flags, uint32_t stream, std::string_view payload) {
  std::string f;
  const size_t n = payload.size();
  f += static_cast<char>(n >> 16);
  f += static_cast<char>(n >> 8);
  f += static_cast<char>(n);
  f += static_cast<char>(type);
  f += static_cast<char>(flags);
  f += static_cast<char>(stream >> 24);
  f += static_cast<char>(stream >> 16);
  f += static_cast<char>(stream >> 8);
  f += static_cast<char>(stream);
  f.append(payload);
  return f;
}

// HPACK for GET / over https, :authority "a": static-table indexes (RFC 7541
// Appendix A) and a literal with an indexed name.
inline std::string get_block() { return std::string("\x82\x87\x84\x41\x01" "a", 6); }
inline std::string post_block() { return std::string("\x83\x87\x84\x41\x01" "a", 6); }

// The client preface and an empty SETTINGS: what every raw test starts with.
inline std::string raw_start() { return std::string(h2::k_client_preface) + frame(NGHTTP2_SETTINGS, 0, 0, {}); }

struct raw_frame {
  uint8_t type = 0;
  uint8_t flags = 0;
  uint32_t stream = 0;
  std::string payload;
};

// Everything the server has to send, as frames (it consumes the output).
inline std::vector<raw_frame> server_frames(h2::server_session& s) {
  std::string bytes;
  while (s.has_output()) {
    auto v = s.pending_output();
    bytes.append(v.data(), v.size());
    s.consume_output(v.size());
  }
  std::vector<raw_frame> out;
  size_t at = 0;
  while (at + 9 <= bytes.size()) {
    const auto* b = reinterpret_cast<const uint8_t*>(bytes.data() + at);
    const size_t len = (size_t{b[0]} << 16) | (size_t{b[1]} << 8) | b[2];
    REQUIRE(at + 9 + len <= bytes.size());
    raw_frame f;
    f.type = b[3];
    f.flags = b[4];
    f.stream = ((uint32_t{b[5]} << 24) | (uint32_t{b[6]} << 16) | (uint32_t{b[7]} << 8) | b[8]) & 0x7fffffffu;
    f.payload.assign(bytes.data() + at + 9, len);
    out.push_back(std::move(f));
    at += 9 + len;
  }
  CHECK(at == bytes.size());
  return out;
}

inline uint32_t be32(std::string_view p, size_t at) {
  const auto* b = reinterpret_cast<const uint8_t*>(p.data() + at);
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
}

// Returns: the error code of the last GOAWAY among `frames`; -1 when none.
inline int64_t goaway_code(const std::vector<raw_frame>& frames) {
  int64_t code = -1;
  for (const raw_frame& f : frames)
    if (f.type == NGHTTP2_GOAWAY && f.payload.size() >= 8) code = be32(f.payload, 4);
  return code;
}

// Returns: the error code of the RST_STREAM on `stream`; -1 when none.
inline int64_t rst_code(const std::vector<raw_frame>& frames, uint32_t stream) {
  for (const raw_frame& f : frames)
    if (f.type == NGHTTP2_RST_STREAM && f.stream == stream && f.payload.size() == 4) return be32(f.payload, 0);
  return -1;
}

}  // namespace h2_test
