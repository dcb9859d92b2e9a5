// The client transport under protocols it does not know: two recording
// fakes stand where HTTP/1.1 and HTTP/2 stand in the shard, so what the
// transport does -- the sniff, the send and its completion, deadlines,
// lingering, pause, drain, close and free -- is seen without either codec.
#include <doctest/doctest.h>
#include <sys/socket.h>

#include <string>
#include <vector>

#include "client_transport.hpp"
#include "codec_harness.hpp"
#include "../tls/tls_peer.hpp"

namespace {

namespace proxy = sluice::proxy;
using codec_test::client_conn;
using proxy::deadline_kind;
using proxy::downstream_conn;

// Echoes what it reads, and obeys commands in it: "END" (end_conn),
// "CLOSE" (close_conn), "PAUSE" (pause_receive), "WAIT" (a deadline now),
// "BIG" (a 16 MiB answer).
struct fake_protocol final : proxy::conn_protocol {
  proxy::conn_transport* t = nullptr;
  downstream_conn* d = nullptr;
  int adopted = 0, closes = 0, frees = 0, gone = 0, progress = 0, drains = 0, cuts = 0;
  size_t progress_bytes = 0;
  bool shut_at_free = false;  // the socket was shut down before the free
  bool ending = false;  // END came: end_conn once its echo went
  std::string first, got, pending, out;
  std::vector<int> sent;
  std::vector<deadline_kind> deadlines;

  bool adopt(downstream_conn* c, std::string_view bytes) noexcept override {
    ++adopted;
    d = c;
    first = std::string(bytes);
    take(bytes);
    return true;
  }
  void on_bytes(downstream_conn*, std::string_view bytes) noexcept override { take(bytes); }
  void on_progress(downstream_conn*, size_t bytes) noexcept override {
    ++progress;
    progress_bytes += bytes;
  }
  void on_sent(downstream_conn* c, int res) noexcept override {
    sent.push_back(res);
    if (c->state == proxy::conn_state::closing) return;
    flush();
    if (ending && !c->send_busy) t->end_conn(c, false);
  }
  void on_peer_gone(downstream_conn* c) noexcept override {
    ++gone;
    t->close_conn(c);
  }
  void on_deadline(downstream_conn* c, deadline_kind k) noexcept override {
    deadlines.push_back(k);
    t->close_conn(c);
  }
  void on_close(downstream_conn*) noexcept override { ++closes; }
  void on_free(downstream_conn* c) noexcept override {
    char b;
    shut_at_free = ::recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    ++frees;
    if (c == d) d = nullptr;
  }
  void drain(downstream_conn*) noexcept override { ++drains; }
  void cut(downstream_conn*) noexcept override { ++cuts; }

 private:
  void take(std::string_view bytes) {
    got += bytes;
    pending += bytes;
    if (bytes.find("BIG") != std::string_view::npos) {
      pending += std::string(16u << 20, 'b');
      pending += "!";
    }
    if (bytes.find("PAUSE") != std::string_view::npos) t->pause_receive(d);
    if (bytes.find("WAIT") != std::string_view::npos) t->set_deadline(d, deadline_kind::body, 1);
    if (bytes.find("CLOSE") != std::string_view::npos) {
      t->close_conn(d);
      return;
    }
    if (bytes.find("END") != std::string_view::npos) ending = true;
    flush();
  }
  void flush() {
    if (d == nullptr || d->send_busy || pending.empty() || d->state != proxy::conn_state::idle) return;
    out.swap(pending);
    pending.clear();
    d->send_iov[0] = {out.data(), out.size()};
    d->send_iov_count = 1;
    t->send_output(d);
  }
};

struct transport_fixture final : codec_test::loop_fixture {
  std::unique_ptr<proxy::client_transport> transport;
  fake_protocol first, second;

  transport_fixture() : loop_fixture(codec_test::k_config) {
    transport = std::make_unique<proxy::client_transport>(*ctx, listen_fd, -1);
    first.t = second.t = transport.get();
    transport->set_protocols(&first, &second);
    REQUIRE(transport->init());
  }
  ~transport_fixture() override {
    close_all([&] { return transport->connection_count(); });
    transport.reset();
  }
  void iterate(uint64_t now) override { transport->on_iteration(now); }
  uint64_t stat(sluice::metrics::stat s) const { return metrics->shard(0).at(s).get(); }
};

constexpr std::string_view k_preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

}  // namespace

TEST_SUITE("client::transport") {
  TEST_CASE("a protocol it does not know: first bytes, echo, the send's completion, peer close, free") {
    transport_fixture f;
    client_conn& c = f.connect();
    f.send(c, "hello");
    REQUIRE(f.run_until([&] { return c.received == "hello"; }));
    CHECK(f.first.adopted == 1);
    CHECK(f.second.adopted == 0);
    CHECK(f.first.first == "hello");
    REQUIRE(f.run_until([&] { return !f.first.sent.empty(); }));
    CHECK(f.first.sent == std::vector<int>{5});
    f.send(c, " again");
    REQUIRE(f.run_until([&] { return c.received == "hello again"; }));
    CHECK(f.first.adopted == 1);  // later bytes are the protocol's, no second sniff
    c.close();
    REQUIRE(f.run_until([&] { return f.first.frees == 1; }));
    CHECK(f.first.gone == 1);
    CHECK(f.first.closes == 1);
    CHECK(f.transport->connection_count() == 0);
  }

  TEST_CASE("the HTTP/2 preface, split across writes, goes to the second protocol whole") {
    transport_fixture f;
    client_conn& c = f.connect();
    f.send(c, k_preface.substr(0, 8));
    // Not enough to tell: nobody has it yet.
    for (int i = 0; i < 20; ++i) f.turn();
    CHECK(f.first.adopted + f.second.adopted == 0);
    f.send(c, std::string(k_preface.substr(8)) + "x");
    REQUIRE(f.run_until([&] { return f.second.adopted == 1; }));
    CHECK(f.second.first == std::string(k_preface) + "x");
    CHECK(f.first.adopted == 0);
  }

  TEST_CASE("bytes that only start like the preface go to the first protocol") {
    transport_fixture f;
    client_conn& c = f.connect();
    f.send(c, "PRI * HTTP/1.1\r\n");
    REQUIRE(f.run_until([&] { return f.first.adopted == 1; }));
    CHECK(f.second.adopted == 0);
  }

  TEST_CASE("a ClientHello on the plaintext port: the alert, the close, no protocol") {
    transport_fixture f;
    client_conn& c = f.connect();
    f.send(c, std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11));
    REQUIRE(f.run_until([&] { return c.eof; }));
    CHECK(c.received == sluice::tls::k_tls_on_plain_port_alert);
    CHECK(f.first.adopted + f.second.adopted == 0);
    CHECK(f.stat(sluice::metrics::stat::edge_protocol_mismatches) == 1);
    REQUIRE(f.run_until([&] { return f.transport->connection_count() == 0; }));
  }

  TEST_CASE("a send larger than the socket takes: the protocol hears of each piece, and of its end once") {
    transport_fixture f;
    client_conn& c = f.connect();
    f.send(c, "BIG");
    // The client reads only now and then: the kernel takes the send in pieces.
    REQUIRE(f.run_until([&] { return c.received.size() == 3 + (16u << 20) + 1; }, 100000));
    REQUIRE(f.run_until([&] { return !f.first.sent.empty(); }));
    REQUIRE(f.first.sent.size() == 1);
    CHECK(f.first.sent[0] > 0);
    CHECK(f.first.progress_bytes + static_cast<size_t>(f.first.sent[0]) == 3 + (16u << 20) + 1);
    CHECK(c.received.substr(0, 4) == "BIGb");
    CHECK(c.received.back() == '!');
    CHECK(c.received.find_first_not_of('b', 3) == c.received.size() - 1);
  }

  TEST_CASE("a deadline the protocol set comes back to it, of its kind") {
    transport_fixture f;
    client_conn& c = f.connect();
    f.send(c, "WAIT");
    REQUIRE(f.run_until([&] { return !f.first.deadlines.empty(); }));
    CHECK(f.first.deadlines == std::vector<deadline_kind>{deadline_kind::body});
    REQUIRE(f.run_until([&] { return c.eof; }));
    CHECK(f.first.closes == 1);
  }

  TEST_CASE("a client that says nothing is closed at the header timeout, no protocol involved") {
    transport_fixture f;
    client_conn& c = f.connect();
    // The header deadline is seconds long: fire it by hand.
    f.transport->on_iteration(f.ring->now_ms() + f.config->server.header_timeout_ms + 1);
    REQUIRE(f.run_until([&] { return c.eof; }));
    CHECK(f.first.adopted + f.second.adopted == 0);
    REQUIRE(f.run_until([&] { return f.transport->connection_count() == 0; }));
  }

  TEST_CASE("end_conn lingers: the answer, EOF, what the client still sends is dropped, then the close") {
    transport_fixture f;
    client_conn& c = f.connect();
    f.send(c, "bye END");
    REQUIRE(f.run_until([&] { return c.eof; }));
    CHECK(c.received == "bye END");
    CHECK(f.first.closes == 1);
    CHECK(f.transport->connection_count() == 1);  // still reading, to drop
    f.send(c, "more");
    for (int i = 0; i < 20; ++i) f.turn();
    CHECK(f.first.got == "bye END");
    c.close();
    REQUIRE(f.run_until([&] { return f.first.frees == 1; }));
    CHECK(f.first.gone == 0);  // its client was done with it: nothing more to tell
  }

  TEST_CASE("pause_receive holds the client's bytes back until the next resume") {
    transport_fixture f;
    client_conn& c = f.connect();
    f.send(c, "PAUSE");
    REQUIRE(f.run_until([&] { return f.first.got == "PAUSE" && f.first.d != nullptr && !f.first.d->recv.armed(); }));
    f.send(c, "more");
    for (int i = 0; i < 20; ++i) f.turn();
    CHECK(f.first.got == "PAUSE");
    f.transport->resume_receive(f.first.d);
    REQUIRE(f.run_until([&] { return f.first.got == "PAUSEmore"; }));
  }

  TEST_CASE("drain: a connection that said nothing closes, one with a protocol is asked to drain; cut cuts it") {
    transport_fixture f;
    client_conn& quiet = f.connect();
    client_conn& busy = f.connect();
    f.send(busy, "x");
    REQUIRE(f.run_until([&] { return f.first.adopted == 1; }));
    f.ctx->draining = true;
    f.transport->begin_drain();
    REQUIRE(f.run_until([&] { return quiet.eof; }));
    CHECK(f.first.drains == 1);
    CHECK(!busy.eof);
    f.transport->cut_drain();
    CHECK(f.first.cuts == 1);
    REQUIRE(f.run_until([&] { return busy.eof && f.transport->connection_count() == 0; }));
    CHECK(f.first.closes == 1);
    CHECK(f.first.frees == 1);
  }

  TEST_CASE("a protocol may close the connection inside any call and still read it until it returns") {
    transport_fixture f;
    client_conn& c = f.connect();
    f.send(c, "CLOSE");
    REQUIRE(f.run_until([&] { return f.first.frees == 1; }));
    CHECK(f.first.closes == 1);
    CHECK(c.received.empty());
    REQUIRE(f.run_until([&] { return c.eof; }));
  }

  TEST_CASE("close_conn from a call of the protocol's own, a TLS send waiting for ring room: freed once, after its shutdown") {
    transport_fixture f;
    client_conn& c = f.connect();
    f.send(c, "PAUSE");  // the receive is cancelled: it holds nothing
    REQUIRE(f.run_until([&] { return f.first.d != nullptr && !f.first.d->recv.armed() && !f.first.sent.empty(); }));
    downstream_conn* d = f.first.d;
    REQUIRE(d->ops == 0);
    // What tls_pump leaves after a failed write: a send in progress, no
    // ciphertext send in flight.
    auto tctx = sluice::tls::context::load(tls_test::test_pki().options());
    d->tls = std::make_unique<sluice::tls::session>(*tctx);
    d->tls_failed = true;
    d->send_busy = true;
    ++d->ops;  // as send_output counts it
    f.transport->close_conn(d);  // as a backend's event does: nothing else holds d
    CHECK(f.first.frees == 1);
    CHECK(f.first.sent.size() == 2);  // the send ended (-ECANCELED), its protocol heard
    CHECK(f.first.shut_at_free);      // freed by close_conn's last step, not inside it
  }
}
