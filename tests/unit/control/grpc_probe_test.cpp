// The grpc:// health probe's HTTP/2 session against an in-memory nghttp2
// server session: the requests it makes (paths, headers, ModelReady's
// bytes) and the outcome for each kind of answer, bytes moved by hand.
#include <doctest/doctest.h>

#include <nghttp2/nghttp2.h>

#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "grpc_probe.hpp"

using sluice::control::grpc_ready_probe;
using outcome = grpc_ready_probe::outcome;
using namespace std::literals;

namespace {

// How the fake server answers one RPC.
struct answer {
  bool ready = true;
  int grpc_status = 0;
  bool trailers_only = false;  // grpc-status in the response headers, no DATA
  bool reset = false;          // RST_STREAM instead of an answer
};

struct seen_request {
  std::map<std::string, std::string> headers;
  std::string body;
};

// Test-local: a KServe server's two readiness RPCs on an nghttp2 server
// session.
struct fake_server {
  nghttp2_session* session = nullptr;
  answer server_ready, model_ready;
  std::map<int32_t, seen_request> by_stream;
  std::vector<int32_t> order;
  std::map<int32_t, std::string> pending_body;  // response DATA not yet read by nghttp2
  std::map<int32_t, std::string> trailer_status;  // grpc-status, kept until nghttp2 copied it

  fake_server() {
    nghttp2_session_callbacks* cbs = nullptr;
    REQUIRE(nghttp2_session_callbacks_new(&cbs) == 0);
    nghttp2_session_callbacks_set_on_header_callback(cbs, &on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &on_data);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &on_frame);
    REQUIRE(nghttp2_session_server_new(&session, cbs, this) == 0);
    nghttp2_session_callbacks_del(cbs);
    REQUIRE(nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, nullptr, 0) == 0);
  }
  ~fake_server() { nghttp2_session_del(session); }
  fake_server(const fake_server&) = delete;
  fake_server& operator=(const fake_server&) = delete;

  std::vector<std::string> paths() const {
    std::vector<std::string> out;
    for (int32_t id : order) out.push_back(by_stream.at(id).headers.at(":path"));
    return out;
  }
  const seen_request& request(size_t i) const { return by_stream.at(order.at(i)); }

  static int on_header(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                       const uint8_t* value, size_t valuelen, uint8_t, void* user) {
    auto& self = *static_cast<fake_server*>(user);
    if (!self.by_stream.contains(frame->hd.stream_id)) self.order.push_back(frame->hd.stream_id);
    self.by_stream[frame->hd.stream_id].headers[std::string(reinterpret_cast<const char*>(name), namelen)] =
        std::string(reinterpret_cast<const char*>(value), valuelen);
    return 0;
  }
  static int on_data(nghttp2_session*, uint8_t, int32_t stream_id, const uint8_t* data, size_t len, void* user) {
    static_cast<fake_server*>(user)->by_stream[stream_id].body.append(reinterpret_cast<const char*>(data), len);
    return 0;
  }
  static ssize_t read_body(nghttp2_session* s, int32_t stream_id, uint8_t* buf, size_t length, uint32_t* flags,
                           nghttp2_data_source*, void* user) {
    auto& self = *static_cast<fake_server*>(user);
    std::string& body = self.pending_body[stream_id];
    const size_t n = body.size() < length ? body.size() : length;
    std::memcpy(buf, body.data(), n);
    body.erase(0, n);
    if (body.empty()) {
      *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
      const nghttp2_nv trailer[] = {nv("grpc-status", self.trailer_status[stream_id])};
      REQUIRE(nghttp2_submit_trailer(s, stream_id, trailer, 1) == 0);
    }
    return static_cast<ssize_t>(n);
  }
  // nghttp2 copies both at submit (NGHTTP2_NV_FLAG_NONE); `value` must
  // live until then, so never a temporary.
  static nghttp2_nv nv(const char* name, const std::string& value) {
    return {reinterpret_cast<uint8_t*>(const_cast<char*>(name)),
            reinterpret_cast<uint8_t*>(const_cast<char*>(value.c_str())), std::strlen(name), value.size(),
            NGHTTP2_NV_FLAG_NONE};
  }
  static int on_frame(nghttp2_session* s, const nghttp2_frame* frame, void* user) {
    auto& self = *static_cast<fake_server*>(user);
    if ((frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) ||
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) {
      return 0;
    }
    const int32_t id = frame->hd.stream_id;
    const std::string& path = self.by_stream[id].headers[":path"];
    const answer& a = path.ends_with("/ModelReady") ? self.model_ready : self.server_ready;
    if (a.reset) return nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, id, NGHTTP2_INTERNAL_ERROR);
    const std::string status = "200", type = "application/grpc", grpc_status = std::to_string(a.grpc_status);
    if (a.trailers_only) {
      const nghttp2_nv h[] = {nv(":status", status), nv("content-type", type), nv("grpc-status", grpc_status)};
      return nghttp2_submit_response(s, id, h, 3, nullptr);
    }
    self.trailer_status[id] = grpc_status;
    self.pending_body[id] = a.ready ? "\0\0\0\0\x02\x08\x01"s : "\0\0\0\0\0"s;  // proto3 leaves false out
    const nghttp2_nv h[] = {nv(":status", status), nv("content-type", type)};
    nghttp2_data_provider body;
    body.source.ptr = nullptr;
    body.read_callback = &read_body;
    return nghttp2_submit_response(s, id, h, 2, &body);
  }
};

// Moves bytes both ways until the probe decides or nothing moves;
// `chunk` > 0 hands the server's bytes to the probe that many at a time.
void exchange(grpc_ready_probe& probe, fake_server& server, size_t chunk = 0) {
  for (int round = 0; round < 100 && probe.result() == outcome::pending; ++round) {
    bool moved = false;
    for (std::string_view out = probe.next_send(); !out.empty(); out = probe.next_send()) {
      REQUIRE(nghttp2_session_mem_recv(server.session, reinterpret_cast<const uint8_t*>(out.data()), out.size()) ==
              static_cast<ssize_t>(out.size()));
      moved = true;
    }
    std::string back;
    for (;;) {
      const uint8_t* data = nullptr;
      const ssize_t n = nghttp2_session_mem_send(server.session, &data);
      REQUIRE(n >= 0);
      if (n == 0) break;
      back.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
    if (!back.empty()) moved = true;
    const size_t step = chunk == 0 ? back.size() : chunk;
    for (size_t at = 0; at < back.size(); at += step) probe.on_recv(std::string_view(back).substr(at, step));
    if (!moved) break;
  }
}

}  // namespace

TEST_SUITE("control::grpc_ready_probe") {
  TEST_CASE("ServerReady then ModelReady for the model, both ready: ready") {
    grpc_ready_probe probe;
    probe.set_target("10.0.0.7:8001", "mock-model", 1000);
    fake_server server;
    REQUIRE(probe.begin());
    SUBCASE("whole answers") { exchange(probe, server); }
    SUBCASE("the answer a byte at a time") { exchange(probe, server, 1); }
    CHECK(probe.result() == outcome::ready);
    REQUIRE(server.paths() == std::vector<std::string>{"/inference.GRPCInferenceService/ServerReady",
                                                        "/inference.GRPCInferenceService/ModelReady"});
    for (size_t i = 0; i < 2; ++i) {
      const auto& h = server.request(i).headers;
      CHECK(h.at(":method") == "POST");
      CHECK(h.at(":scheme") == "http");
      CHECK(h.at(":authority") == "10.0.0.7:8001");
      CHECK(h.at("content-type") == "application/grpc");
      CHECK(h.at("te") == "trailers");
      CHECK(h.at("grpc-timeout") == "1000m");
    }
    CHECK(server.request(0).body == "\0\0\0\0\0"sv);
    CHECK(server.request(1).body == "\0\0\0\0\x0c\x0a\x0amock-model"sv);
  }

  TEST_CASE("no model: ServerReady alone decides") {
    grpc_ready_probe probe;
    probe.set_target("b:1", "", 250);
    fake_server server;
    REQUIRE(probe.begin());
    exchange(probe, server);
    INFO("why: ", probe.why_call(), " ", probe.why());
    CHECK(probe.result() == outcome::ready);
    CHECK(server.paths() == std::vector<std::string>{"/inference.GRPCInferenceService/ServerReady"});
    CHECK(server.request(0).headers.at("grpc-timeout") == "250m");
  }

  TEST_CASE("an answer other than ready is not_ready, naming the call") {
    grpc_ready_probe probe;
    probe.set_target("b:1", "m", 1000);
    fake_server server;
    std::string_view call = "ModelReady";
    size_t calls = 2;
    SUBCASE("ModelReady says false") { server.model_ready.ready = false; }
    SUBCASE("ServerReady says false: ModelReady is not asked") {
      server.server_ready.ready = false;
      call = "ServerReady";
      calls = 1;
    }
    SUBCASE("ServerReady answers UNAVAILABLE, Trailers-Only") {
      server.server_ready = {.ready = false, .grpc_status = 14, .trailers_only = true};
      call = "ServerReady";
      calls = 1;
    }
    SUBCASE("ModelReady answers NOT_FOUND") {
      server.model_ready.grpc_status = 5;
    }
    SUBCASE("ModelReady's stream is reset") { server.model_ready.reset = true; }
    REQUIRE(probe.begin());
    exchange(probe, server);
    CHECK(probe.result() == outcome::not_ready);
    CHECK(probe.why_call() == call);
    CHECK_FALSE(probe.why().empty());
    CHECK(server.order.size() == calls);
  }

  TEST_CASE("a peer that closes or speaks HTTP/1 fails the probe") {
    grpc_ready_probe probe;
    probe.set_target("b:1", "m", 1000);
    REQUIRE(probe.begin());
    CHECK_FALSE(probe.next_send().empty());
    SUBCASE("closed before answering") { probe.on_peer_closed(); }
    SUBCASE("an HTTP/1.1 answer: nghttp2 sends GOAWAY, then the session is over") {
      probe.on_recv("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
      for (int i = 0; i < 10 && !probe.next_send().empty(); ++i) {
      }
    }
    CHECK(probe.result() == outcome::failed);
    CHECK(probe.next_send().empty());
  }

  TEST_CASE("more bytes than a readiness answer needs fail the probe") {
    grpc_ready_probe probe;
    probe.set_target("b:1", "m", 1000);
    REQUIRE(probe.begin());
    // A PING frame repeated: valid HTTP/2, each answered, never an answer.
    const std::string ping = "\0\0\x08\x06\0\0\0\0\0" "12345678"s;
    std::string settings = "\0\0\0\x04\0\0\0\0\0"s;
    probe.on_recv(settings);
    for (size_t sent = 0; sent <= grpc_ready_probe::k_recv_bytes_max && probe.result() == outcome::pending;
         sent += ping.size()) {
      probe.on_recv(ping);
      while (!probe.next_send().empty()) {
      }
    }
    CHECK(probe.result() == outcome::failed);
  }

  TEST_CASE("one probe object serves probe after probe") {
    grpc_ready_probe probe;
    probe.set_target("b:1", "m", 1000);
    for (bool ready : {true, false, true}) {
      fake_server server;
      server.model_ready.ready = ready;
      REQUIRE(probe.begin());
      exchange(probe, server);
      CHECK(probe.result() == (ready ? outcome::ready : outcome::not_ready));
      probe.end();
    }
  }

  TEST_CASE("a huge timeout is sent in seconds (grpc-timeout allows 8 digits)") {
    grpc_ready_probe probe;
    probe.set_target("b:1", "", 4000000000u);
    fake_server server;
    REQUIRE(probe.begin());
    exchange(probe, server);
    CHECK(server.request(0).headers.at("grpc-timeout") == "4000000S");
  }

  TEST_CASE("a GOAWAY with ServerReady's answer fails the probe as a GOAWAY, not out of memory") {
    grpc_ready_probe probe;
    probe.set_target("b:1", "m", 1000);
    fake_server server;
    REQUIRE(probe.begin());
    for (std::string_view out = probe.next_send(); !out.empty(); out = probe.next_send()) {
      REQUIRE(nghttp2_session_mem_recv(server.session, reinterpret_cast<const uint8_t*>(out.data()), out.size()) ==
              static_cast<ssize_t>(out.size()));
    }
    REQUIRE(server.order.size() == 1);  // ServerReady's answer is queued
    REQUIRE(nghttp2_submit_goaway(server.session, NGHTTP2_FLAG_NONE, server.order[0], NGHTTP2_NO_ERROR, nullptr, 0) == 0);
    exchange(probe, server);
    CHECK(probe.result() == outcome::failed);
    CHECK(probe.why() == "connection closed by GOAWAY");
  }
}
