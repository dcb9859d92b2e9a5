// grpc::client_session, the HTTP/2 client session of the Triton adapter and
// the health probe, against a plain nghttp2 server session in memory: what
// a call sends, what the owner hears (fields, DATA, the close), a forgotten
// call, an owner that takes no more DATA, flow control by hand, GOAWAY.
#include <doctest/doctest.h>

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/grpc/h2_client.hpp"

namespace grpc = sluice::grpc;

namespace {

// A field for nghttp2 (which only reads through these pointers).
nghttp2_nv nv(std::string_view name, std::string_view value) {
  return {reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
          reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(), value.size(),
          NGHTTP2_NV_FLAG_NONE};
}

// The owner's side: what each call heard.
struct heard {
  std::vector<std::pair<std::string, std::string>> fields;
  int headers_ends = 0;
  std::string data;
  int closes = 0;
  uint32_t code = 0xffffffff;
  std::string request;  // what read_request still has to give
  size_t data_max = ~size_t{0};  // on_data answers false past this
};

struct owner final : grpc::session_events {
  void on_field(void* c, std::string_view n, std::string_view v) noexcept override {
    static_cast<heard*>(c)->fields.emplace_back(n, v);
  }
  void on_headers_end(void* c) noexcept override { ++static_cast<heard*>(c)->headers_ends; }
  bool on_data(void* c, std::string_view bytes) noexcept override {
    heard& h = *static_cast<heard*>(c);
    h.data += bytes;
    return h.data.size() <= h.data_max;
  }
  void on_close(void* c, uint32_t code) noexcept override {
    ++static_cast<heard*>(c)->closes;
    static_cast<heard*>(c)->code = code;
  }
  size_t read_request(void* c, char* out, size_t room, bool& last) noexcept override {
    heard& h = *static_cast<heard*>(c);
    const size_t n = std::min(room, h.request.size());
    std::memcpy(out, h.request.data(), n);
    h.request.erase(0, n);
    last = h.request.empty();
    return n;
  }
};

// A plain nghttp2 server: records each stream's head and body, answers
// when told.
struct server {
  nghttp2_session* s = nullptr;
  std::map<int32_t, std::map<std::string, std::string>> heads;
  std::map<int32_t, std::string> bodies;
  std::map<int32_t, uint32_t> resets;  // RST_STREAM codes from the client
  std::map<int32_t, std::string> to_send;
  std::map<int32_t, bool> trailers_after;

  server() {
    nghttp2_session_callbacks* cbs = nullptr;
    REQUIRE(nghttp2_session_callbacks_new(&cbs) == 0);
    nghttp2_session_callbacks_set_on_header_callback(
        cbs, [](nghttp2_session*, const nghttp2_frame* f, const uint8_t* n, size_t nl, const uint8_t* v, size_t vl,
                uint8_t, void* u) -> int {
          static_cast<server*>(u)->heads[f->hd.stream_id][std::string(reinterpret_cast<const char*>(n), nl)] =
              std::string(reinterpret_cast<const char*>(v), vl);
          return 0;
        });
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
        cbs, [](nghttp2_session*, uint8_t, int32_t id, const uint8_t* d, size_t len, void* u) -> int {
          static_cast<server*>(u)->bodies[id].append(reinterpret_cast<const char*>(d), len);
          return 0;
        });
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, [](nghttp2_session*, const nghttp2_frame* f,
                                                                 void* u) -> int {
      if (f->hd.type == NGHTTP2_RST_STREAM) static_cast<server*>(u)->resets[f->hd.stream_id] = f->rst_stream.error_code;
      return 0;
    });
    REQUIRE(nghttp2_session_server_new(&s, cbs, this) == 0);
    nghttp2_session_callbacks_del(cbs);
    REQUIRE(nghttp2_submit_settings(s, NGHTTP2_FLAG_NONE, nullptr, 0) == 0);
  }
  ~server() { nghttp2_session_del(s); }
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  // 200 + gRPC head, `body` as DATA, then trailers with `grpc_status`.
  void answer(int32_t id, std::string body) {
    const nghttp2_nv head[] = {nv(":status", "200"), nv("content-type", "application/grpc")};
    to_send[id] = std::move(body);
    nghttp2_data_provider dp{};
    dp.read_callback = [](nghttp2_session* ss, int32_t sid, uint8_t* buf, size_t len, uint32_t* flags,
                          nghttp2_data_source*, void* u) -> ssize_t {
      std::string& b = static_cast<server*>(u)->to_send[sid];
      const size_t n = std::min(len, b.size());
      std::memcpy(buf, b.data(), n);
      b.erase(0, n);
      if (b.empty()) {
        *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        const nghttp2_nv trailers[] = {nv("grpc-status", "0")};
        nghttp2_submit_trailer(ss, sid, trailers, 1);
      }
      return static_cast<ssize_t>(n);
    };
    REQUIRE(nghttp2_submit_response(s, id, head, 2, &dp) == 0);
  }
};

// Moves bytes both ways until neither side has any.
void pump(grpc::client_session& c, server& srv, int rounds = 64) {
  for (int i = 0; i < rounds; ++i) {
    bool moved = false;
    for (std::string_view out = c.next_send(); !out.empty(); out = c.next_send()) {
      REQUIRE(nghttp2_session_mem_recv(srv.s, reinterpret_cast<const uint8_t*>(out.data()), out.size()) ==
              static_cast<ssize_t>(out.size()));
      moved = true;
    }
    const uint8_t* d = nullptr;
    for (ssize_t n = nghttp2_session_mem_send(srv.s, &d); n > 0; n = nghttp2_session_mem_send(srv.s, &d)) {
      REQUIRE(c.feed(std::string_view(reinterpret_cast<const char*>(d), static_cast<size_t>(n))));
      moved = true;
    }
    if (!moved) return;
  }
}

std::string field(const heard& h, std::string_view name) {
  for (const auto& [n, v] : h.fields) {
    if (n == name) return v;
  }
  return "(none)";
}

}  // namespace

TEST_CASE("a call: its head and request reach the server; the owner hears the head, DATA, trailers, the close") {
  owner o;
  server srv;
  grpc::client_session c;
  REQUIRE(c.open(o, {}));
  heard h;
  h.request = std::string("\0\0\0\0\3abc", 8);
  const int32_t id = c.call("/pkg.Svc/Method", "backend:8001", "sluice-test", "250m", true, &h);
  REQUIRE(id > 0);
  pump(c, srv);
  CHECK(srv.heads[id][":method"] == "POST");
  CHECK(srv.heads[id][":path"] == "/pkg.Svc/Method");
  CHECK(srv.heads[id][":authority"] == "backend:8001");
  CHECK(srv.heads[id]["te"] == "trailers");
  CHECK(srv.heads[id]["grpc-timeout"] == "250m");
  CHECK(srv.bodies[id] == std::string("\0\0\0\0\3abc", 8));
  srv.answer(id, "reply-bytes");
  pump(c, srv);
  CHECK(field(h, ":status") == "200");
  CHECK(field(h, "grpc-status") == "0");  // from the trailers
  CHECK(h.headers_ends == 2);              // the head and the trailers
  CHECK(h.data == "reply-bytes");
  CHECK(h.closes == 1);
  CHECK(h.code == 0);
  CHECK(!c.failed());
  CHECK(c.takes_calls());
}

TEST_CASE("a forgotten call hears nothing more, and its unsent request resets the stream") {
  owner o;
  server srv;
  grpc::client_session c;
  REQUIRE(c.open(o, {}));
  heard h;
  h.request = "x";
  const int32_t id = c.call("/a/B", "h", "t", {}, false, &h);
  REQUIRE(id > 0);
  c.forget(id);  // before its request was read
  pump(c, srv);
  CHECK(h.fields.empty());
  CHECK(h.closes == 0);
  CHECK(srv.bodies[id].empty());
  CHECK(srv.resets.contains(id));
}

TEST_CASE("an owner that takes no more DATA: the stream is reset INTERNAL_ERROR, the others go on") {
  owner o;
  server srv;
  grpc::client_session c;
  REQUIRE(c.open(o, {}));
  heard small, big;
  big.data_max = 4;
  const int32_t a = c.call("/a/B", "h", "t", {}, false, &small);
  const int32_t b = c.call("/a/B", "h", "t", {}, false, &big);
  pump(c, srv);
  srv.answer(b, "0123456789");
  srv.answer(a, "fine");
  pump(c, srv);
  CHECK(srv.resets[b] == NGHTTP2_INTERNAL_ERROR);
  CHECK(big.code == NGHTTP2_INTERNAL_ERROR);
  CHECK(small.data == "fine");
  CHECK(small.code == 0);
}

TEST_CASE("manual windows: a stream gets no more than its window until its owner consumes; the connection's goes back by itself") {
  owner o;
  server srv;
  grpc::client_session c;
  grpc::session_settings st;
  st.manual_window = true;
  st.stream_window = 16384;
  REQUIRE(c.open(o, st));
  heard one, two;
  const int32_t a = c.call("/a/B", "h", "t", {}, false, &one);
  const int32_t b = c.call("/a/B", "h", "t", {}, false, &two);
  pump(c, srv);
  srv.answer(a, std::string(60000, 'a'));
  pump(c, srv);
  CHECK(one.data.size() == 16384);  // its window, and no more
  c.consume(a, one.data.size());
  pump(c, srv);
  CHECK(one.data.size() == 32768);
  for (int i = 0; i < 4 && one.closes == 0; ++i) {
    c.consume(a, 16384);
    pump(c, srv);
  }
  CHECK(one.data.size() == 60000);
  CHECK(one.closes == 1);
  // The connection's window (65,535) came back after each feed: a second
  // stream still gets its whole window although 60,000 bytes went before.
  srv.answer(b, std::string(30000, 'b'));
  pump(c, srv);
  CHECK(two.data.size() == 16384);
}

TEST_CASE("GOAWAY: no new calls; the session finishes once nothing is left") {
  owner o;
  server srv;
  grpc::client_session c;
  REQUIRE(c.open(o, {}));
  heard h;
  const int32_t id = c.call("/a/B", "h", "t", {}, false, &h);
  pump(c, srv);
  REQUIRE(nghttp2_submit_goaway(srv.s, NGHTTP2_FLAG_NONE, id, NGHTTP2_NO_ERROR, nullptr, 0) == 0);
  pump(c, srv);
  CHECK(!c.takes_calls());
  CHECK(c.call("/a/B", "h", "t", {}, false, &h) == -1);
  CHECK(!c.finished());  // its stream is still open
  srv.answer(id, "last");
  pump(c, srv);
  CHECK(h.data == "last");
  CHECK(c.finished());
}

TEST_CASE("bytes that are not HTTP/2 break the session, with a reason") {
  owner o;
  grpc::client_session c;
  REQUIRE(c.open(o, {}));
  (void)c.next_send();
  const bool ok = c.feed("HTTP/1.1 400 Bad Request\r\n\r\n");
  // nghttp2 answers a bad preface with a GOAWAY rather than an error
  // return; either way no call can be made and the session is done.
  if (ok) {
    while (!c.next_send().empty()) {
    }
    CHECK(c.finished());
  } else {
    CHECK(c.failed());
    CHECK(!c.reason().empty());
  }
  CHECK(!c.takes_calls());
}
