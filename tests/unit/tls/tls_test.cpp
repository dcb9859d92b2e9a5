// tls::context and tls::session against an in-process OpenSSL client
// (tls_peer.hpp).
#include <doctest/doctest.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "sluice/tls/tls.hpp"
#include "tls_peer.hpp"

using namespace tls_test;  // NOLINT(google-build-using-namespace): the test's own helpers

TEST_SUITE("tls::context") {
  TEST_CASE("a chain, its key and a min version load") {
    auto ctx = tls::context::load(test_pki().options());
    REQUIRE(ctx != nullptr);
    CHECK(ctx->native_handle() != nullptr);
    CHECK(tls::parse_version("1.2") == tls::version::tls1_2);
    CHECK(tls::parse_version("1.3") == tls::version::tls1_3);
    CHECK_FALSE(tls::parse_version("1.1").has_value());
    CHECK_FALSE(tls::parse_version("").has_value());
  }

  TEST_CASE("bad files give errors naming the file, never the key's bytes") {
    const pki& p = test_pki();
    tls::context_options o = p.options();
    std::vector<std::string> secrets = pem_body_lines(p.key);
    auto other = pem_body_lines(p.other_key);
    secrets.insert(secrets.end(), other.begin(), other.end());
    REQUIRE(!secrets.empty());
    std::string expect_path, expect_text;

    SUBCASE("missing key file") {
      o.key_path = p.dir + "/absent.pem";
      expect_path = o.key_path;
      expect_text = "No such file";
    }
    SUBCASE("a key file that is no key") {
      o.key_path = p.dir + "/not-a-key.pem";
      write_file(o.key_path, "-----BEGIN PRIVATE KEY-----\nQUJDREVGR0hJSktMTU5PUFFSU1RVVldY\n-----END PRIVATE KEY-----\n");
      secrets.push_back("QUJDREVGR0hJSktMTU5PUFFSU1RVVldY");
      expect_path = o.key_path;
      expect_text = "cannot load the private key";
    }
    SUBCASE("the key of another certificate") {
      o.key_path = p.other_key;
      expect_path = p.other_key;
      expect_text = "mismatch";
    }
    SUBCASE("an encrypted key (no pass phrase prompt)") {
      o.key_path = p.encrypted_key;
      expect_path = p.encrypted_key;
      expect_text = "encrypted";
      auto enc = pem_body_lines(p.encrypted_key);
      secrets.insert(secrets.end(), enc.begin(), enc.end());
    }
    SUBCASE("a certificate file that is no certificate") {
      o.cert_path = p.key;
      expect_path = p.key;
      expect_text = "tls_cert";
    }
    SUBCASE("no key path") {
      o.key_path.clear();
      expect_text = "tls_key is not set";
    }

    std::string message;
    try {
      (void)tls::context::load(o);
    } catch (const tls::context_error& e) {
      message = e.what();
    }
    INFO(message);
    REQUIRE(!message.empty());
    CHECK(message.find(expect_path) != std::string::npos);
    CHECK(message.find(expect_text) != std::string::npos);
    for (const auto& line : secrets) CHECK(message.find(line) == std::string::npos);
  }

  TEST_CASE("buffer caps under 1 KiB are refused") {
    tls::context_options o = test_pki().options();
    o.output_buffer_bytes = 100;
    CHECK_THROWS_AS((void)tls::context::load(o), tls::context_error);
  }
}

TEST_SUITE("tls::session") {
  TEST_CASE("handshakes with TLS 1.2 and 1.3 and sends the chain") {
    auto ctx = tls::context::load(test_pki().options());
    int v = 0;
    std::string name;
    SUBCASE("1.2") { v = TLS1_2_VERSION; name = "TLSv1.2"; }
    SUBCASE("1.3") { v = TLS1_3_VERSION; name = "TLSv1.3"; }
    client c({.max_version = v});
    tls::session s(*ctx);
    CHECK_FALSE(s.handshake_done());
    auto r = run_handshake(c, s);
    INFO(c.errors, s.reason());
    REQUIRE(r.server == status::ok);
    REQUIRE(r.client == 1);
    CHECK(s.handshake_done());
    // The client trusts only the root: the intermediate came from the chain file.
    CHECK(SSL_get_verify_result(c.ssl) == X509_V_OK);
    CHECK(s.version_name() == name);
    CHECK(s.server_name() == "localhost");
    CHECK_FALSE(s.resumed());
    CHECK(s.handshake() == status::ok);
    std::string cipher(s.cipher_name());
    CHECK((cipher.find("GCM") != std::string::npos || cipher.find("CHACHA20") != std::string::npos));
  }

  TEST_CASE("the intermediates come from the cert file: a leaf alone does not verify") {
    tls::context_options o = test_pki().options();
    o.cert_path = test_pki().leaf_only;
    auto ctx = tls::context::load(o);
    client c;
    tls::session s(*ctx);
    auto r = run_handshake(c, s);
    CHECK(r.client == -1);
    CHECK(c.errors.find("certificate verify failed") != std::string::npos);
    CHECK(r.server == status::error);  // the client's alert
  }

  TEST_CASE("a reload: new connections get the new certificate, started ones finish on the old") {
    auto serial_seen = [](client& c) {
      X509* peer = SSL_get1_peer_certificate(c.ssl);
      REQUIRE(peer != nullptr);
      long serial = ASN1_INTEGER_get(X509_get0_serialNumber(peer));
      X509_free(peer);
      return serial;
    };
    auto old_ctx = tls::context::load(test_pki().options());
    client early;
    tls::session started(*old_ctx);
    REQUIRE(early.step_handshake() == 0);
    transfer(early, started);
    REQUIRE(started.handshake() == status::want_read);  // mid-handshake at the reload

    tls::context_options o = test_pki().options();
    o.cert_path = test_pki().chain2;
    auto new_ctx = tls::context::load(o, old_ctx.get());
    old_ctx.reset();  // the listener now holds only the new one

    connected(early, started);
    client late;
    tls::session fresh(*new_ctx);
    connected(late, fresh);
    CHECK(serial_seen(early) != serial_seen(late));
    CHECK(server_to_client(early, started, "old", nullptr) == "old");
    CHECK(server_to_client(late, fresh, "new", nullptr) == "new");
  }

  TEST_CASE("ALPN: h2 first, http/1.1, none, or a fatal alert for only unknown ones") {
    tls::context_options o = test_pki().options();
    std::vector<std::string> offer;
    bool h2_off = false;
    SUBCASE("h2 and http/1.1 -> h2") { offer = {"http/1.1", "h2"}; }
    SUBCASE("http/1.1 only") { offer = {"http/1.1"}; }
    SUBCASE("no ALPN -> http/1.1, not negotiated") {}
    SUBCASE("h2 off in the context -> http/1.1") { offer = {"h2", "http/1.1"}; h2_off = true; }
    SUBCASE("only unknown protocols -> no_application_protocol") { offer = {"spdy/3.1", "h3"}; }
    SUBCASE("h2 only, h2 off -> no_application_protocol") { offer = {"h2"}; h2_off = true; }
    o.h2 = !h2_off;
    auto ctx = tls::context::load(o);
    client c({.alpn = offer});
    tls::session s(*ctx);
    auto r = run_handshake(c, s);
    bool refuse = offer == std::vector<std::string>{"spdy/3.1", "h3"} || (h2_off && offer.size() == 1 && offer[0] == "h2");
    if (refuse) {
      CHECK(r.server == status::error);
      CHECK(s.reason().find("no application protocol") != std::string_view::npos);
      CHECK(r.client == -1);
      CHECK(c.errors.find("no application protocol") != std::string::npos);
      return;
    }
    REQUIRE(r.server == status::ok);
    REQUIRE(r.client == 1);
    const unsigned char* p = nullptr;
    unsigned len = 0;
    SSL_get0_alpn_selected(c.ssl, &p, &len);
    std::string client_saw(reinterpret_cast<const char*>(p), len);
    if (offer.empty()) {
      CHECK(s.alpn() == tls::application_protocol::http1_1);
      CHECK_FALSE(s.alpn_negotiated());
      CHECK(client_saw.empty());
    } else if (offer.size() == 2 && !h2_off) {
      CHECK(s.alpn() == tls::application_protocol::h2);
      CHECK(s.alpn_negotiated());
      CHECK(client_saw == "h2");
    } else {
      CHECK(s.alpn() == tls::application_protocol::http1_1);
      CHECK(s.alpn_negotiated());
      CHECK(client_saw == "http/1.1");
    }
  }

  TEST_CASE("large writes both ways cross records and the output cap") {
    tls::context_options o = test_pki().options();
    o.output_buffer_bytes = 8192;
    o.input_buffer_bytes = 4096;
    auto ctx = tls::context::load(o);
    int v = 0;
    SUBCASE("1.2") { v = TLS1_2_VERSION; }
    SUBCASE("1.3") { v = TLS1_3_VERSION; }
    client c({.max_version = v});
    tls::session s(*ctx);
    connected(c, s);
    const std::string down = pattern(1u << 20);
    bool saw_want_write = false;
    CHECK(server_to_client(c, s, down, &saw_want_write) == down);
    CHECK(saw_want_write);
    const std::string up = pattern((1u << 20) + 12345);
    CHECK(client_to_server(c, s, up) == up);
    // And once more the other way: the session keeps going after a full ring.
    CHECK(server_to_client(c, s, "done", nullptr) == "done");
  }

  TEST_CASE("may_read_more: true while fed records are unread, false exactly when read() would want input") {
    auto ctx = tls::context::load(test_pki().options());
    int v = 0;
    SUBCASE("1.2") { v = TLS1_2_VERSION; }
    SUBCASE("1.3") { v = TLS1_3_VERSION; }
    client c({.max_version = v});
    tls::session s(*ctx);
    connected(c, s);
    transfer(c, s);  // TLS 1.3 tickets out of the way
    char buf[16384];
    // Nothing fed: nothing to read.
    CHECK_FALSE(s.may_read_more());
    CHECK(s.read(buf).st == status::want_read);
    // Three records in one feed, as one receive may bring them.
    for (const char* m : {"one", "two", "three"}) {
      size_t n = 0;
      REQUIRE(SSL_write_ex(c.ssl, m, std::strlen(m), &n) == 1);
    }
    transfer(c, s);
    std::string got;
    int reads = 0;
    while (s.may_read_more()) {
      const auto r = s.read(buf);
      REQUIRE(r.st == status::ok);
      got.append(buf, r.bytes);
      ++reads;
    }
    CHECK(got == "onetwothree");
    CHECK(reads == 3);
    CHECK(s.read(buf).st == status::want_read);
    // A record cut short: fed bytes are left, read() says want_read, and
    // the rest of the record completes it.
    size_t n = 0;
    REQUIRE(SSL_write_ex(c.ssl, "four", 4, &n) == 1);
    char* p = nullptr;
    const int whole = BIO_nread0(c.net, &p);
    REQUIRE(whole > 10);
    REQUIRE(s.feed(std::span<const char>(p, 10)) == status::ok);
    REQUIRE(BIO_nread(c.net, &p, 10) == 10);
    CHECK(s.may_read_more());
    CHECK(s.read(buf).st == status::want_read);
    transfer(c, s);
    REQUIRE(s.may_read_more());
    const auto r = s.read(buf);
    REQUIRE(r.st == status::ok);
    CHECK(std::string(buf, r.bytes) == "four");
    CHECK_FALSE(s.may_read_more());
  }

  TEST_CASE("an error another caller left in the thread's queue fails no session") {
    auto ctx = tls::context::load(test_pki().options());
    client c;
    tls::session s(*ctx);
    connected(c, s);
    transfer(c, s);
    // As if some other OpenSSL call on this thread had failed and left its
    // error queued: SSL_get_error would read it as this session's.
    ERR_raise(ERR_LIB_USER, 1);
    REQUIRE(ERR_peek_error() != 0);
    char buf[64];
    CHECK(s.read(buf).st == status::want_read);
    CHECK_FALSE(s.failed());
    ERR_raise(ERR_LIB_USER, 1);
    CHECK(s.write(std::string_view("hello")).st == status::ok);
    CHECK_FALSE(s.failed());
    transfer(c, s);
    std::string got;
    REQUIRE(c.read_all(got));
    CHECK(got == "hello");
  }

  TEST_CASE("a tiny output cap still completes the handshake, through want_write") {
    tls::context_options o = test_pki().options();
    o.output_buffer_bytes = 1024;  // less than the server's first flight
    auto ctx = tls::context::load(o);
    client c({.max_version = TLS1_2_VERSION});
    tls::session s(*ctx);
    auto r = run_handshake(c, s);
    CHECK(r.server == status::ok);
    CHECK(r.client == 1);
    CHECK(r.saw_want_write);
  }

  TEST_CASE("pending output stays put while more is written behind it") {
    tls::context_options o = test_pki().options();
    o.output_buffer_bytes = 16384;
    auto ctx = tls::context::load(o);
    client c;
    tls::session s(*ctx);
    connected(c, s);
    transfer(c, s);  // TLS 1.3 tickets out of the way
    REQUIRE_FALSE(s.has_output());
    REQUIRE(s.write(std::string_view(pattern(3000))).st == status::ok);
    auto first = s.pending_output();
    REQUIRE(!first.empty());
    const std::string snapshot(first.data(), first.size());
    // As if a send SQE held `first`: the session writes on.
    for (int i = 0; i < 3; ++i) (void)s.write(std::string_view(pattern(3000)));
    CHECK(std::string(first.data(), first.size()) == snapshot);
    CHECK(s.pending_output().data() == first.data());
    CHECK(s.output_size() > first.size());
    // A partial send: the rest starts where it stopped.
    REQUIRE(BIO_write(c.net, first.data(), 100) == 100);
    s.consume_output(100);
    CHECK(s.pending_output().data() == first.data() + 100);
    std::string got;
    transfer(c, s);
    REQUIRE(c.read_all(got));
    CHECK(got.size() == 4 * 3000);
  }

  TEST_CASE("session tickets resume, across one key rotation but not two") {
    for (int v : {TLS1_2_VERSION, TLS1_3_VERSION}) {
      CAPTURE(v);
      auto ctx = tls::context::load(test_pki().options());
      SSL_SESSION* ticket = nullptr;
      {
        client c({.max_version = v});
        tls::session s(*ctx);
        connected(c, s);
        ticket = take_ticket(c, s);
      }
      auto resume = [&](const tls::context& use) {
        client c({.max_version = v, .resume = ticket});
        tls::session s(use);
        connected(c, s);
        CHECK(SSL_session_reused(c.ssl) == (s.resumed() ? 1 : 0));
        return s.resumed();
      };
      CHECK(resume(*ctx));
      ctx->rotate_ticket_keys();
      CHECK(resume(*ctx));  // sealed under what is now the previous key
      // A reload carries the keys over; a context of its own does not know them.
      auto reloaded = tls::context::load(test_pki().options(), ctx.get());
      CHECK(resume(*reloaded));
      CHECK_FALSE(resume(*tls::context::load(test_pki().options())));
      ctx->rotate_ticket_keys();
      CHECK_FALSE(resume(*ctx));  // a full handshake, and it still succeeds
      CHECK(resume(*reloaded));   // the reloaded one was not rotated
      SSL_SESSION_free(ticket);
    }
  }

  TEST_CASE("rotating ticket keys from another thread while handshakes run") {
    auto ctx = tls::context::load(test_pki().options());
    SSL_SESSION* ticket = nullptr;
    {
      client c;
      tls::session s(*ctx);
      connected(c, s);
      ticket = take_ticket(c, s);
    }
    std::atomic<bool> stop{false};
    std::thread control([&] {
      while (!stop.load()) ctx->rotate_ticket_keys();
    });
    int done = 0;
    for (int i = 0; i < 20; ++i) {
      client c({.resume = ticket});
      tls::session s(*ctx);
      auto r = run_handshake(c, s);
      done += r.server == status::ok && r.client == 1;
    }
    stop = true;
    control.join();
    CHECK(done == 20);  // resumed or not, each one completes
    SSL_SESSION_free(ticket);
  }

  TEST_CASE("a connection outlives its context (a reload mid-connection)") {
    auto ctx = tls::context::load(test_pki().options());
    client c;
    tls::session s(*ctx);
    ctx.reset();
    connected(c, s);
    SSL_SESSION_free(take_ticket(c, s));  // the ticket keys of the dropped context are still there
    CHECK(server_to_client(c, s, "still here", nullptr) == "still here");
  }

  TEST_CASE("a renegotiation attempt by a TLS 1.2 client is refused and fails the session") {
    auto ctx = tls::context::load(test_pki().options());
    client c({.max_version = TLS1_2_VERSION});
    tls::session s(*ctx);
    connected(c, s);
    REQUIRE(SSL_renegotiate(c.ssl) == 1);
    CHECK(c.step_handshake() == 0);  // its ClientHello is out
    transfer(c, s);
    char buf[256];
    auto r = s.read(buf);
    CHECK(r.st == status::error);
    CHECK(s.reason().find("renegotiation") != std::string_view::npos);
    // The no_renegotiation alert reaches the client, which gives up.
    CHECK(s.has_output());
    transfer(c, s);
    CHECK(c.step_handshake() == -1);
    CHECK(s.read(buf).st == status::error);
  }

  TEST_CASE("garbage after the handshake is an error") {
    auto ctx = tls::context::load(test_pki().options());
    std::string garbage;
    SUBCASE("plain text") { garbage = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"; }
    SUBCASE("an application record with a bad tag") {
      garbage = std::string("\x17\x03\x03\x00\x20", 5) + std::string(32, '\x5a');
    }
    for (int v : {TLS1_2_VERSION, TLS1_3_VERSION}) {
    CAPTURE(v);
    client c({.max_version = v});
    tls::session s(*ctx);
    connected(c, s);
    transfer(c, s);
    REQUIRE(s.feed(garbage) == status::ok);
    char buf[256];
    auto r = s.read(buf);
    CHECK(r.st == status::error);
    CHECK(r.bytes == 0);
    CHECK(!s.reason().empty());
    CHECK(s.failed());
    CHECK(s.feed("more") == status::error);
    CHECK(s.write(std::string_view("x")).st == status::error);
    CHECK(s.shutdown() == status::closed);
    }
  }

  TEST_CASE("a truncated ClientHello leaves the session wanting input") {
    auto ctx = tls::context::load(test_pki().options());
    client c;
    tls::session s(*ctx);
    REQUIRE(c.step_handshake() == 0);
    char* p = nullptr;
    int n = BIO_nread0(c.net, &p);
    REQUIRE(n > 60);
    REQUIRE(s.feed({p, 60}) == status::ok);
    BIO_nread(c.net, &p, 60);
    for (int i = 0; i < 3; ++i) CHECK(s.handshake() == status::want_read);
    CHECK_FALSE(s.has_output());
    CHECK_FALSE(s.failed());
    // The rest arrives late: the handshake goes on (a deadline is the codec's).
    auto r = run_handshake(c, s);
    CHECK(r.server == status::ok);
    CHECK(r.client == 1);
  }

  TEST_CASE("tls_min_version 1.3 refuses a TLS 1.2-only client") {
    tls::context_options o = test_pki().options();
    o.min_version = tls::version::tls1_3;
    auto ctx = tls::context::load(o);
    client c({.max_version = TLS1_2_VERSION});
    tls::session s(*ctx);
    auto r = run_handshake(c, s);
    CHECK(r.server == status::error);
    CHECK(s.reason().find("unsupported protocol") != std::string_view::npos);
    CHECK(r.client == -1);
    CHECK(c.errors.find("protocol version") != std::string::npos);
  }

  TEST_CASE("the input cap is enforced") {
    tls::context_options o = test_pki().options();
    o.input_buffer_bytes = 1024;
    auto ctx = tls::context::load(o);
    tls::session s(*ctx);
    CHECK(s.input_space() == 1024);
    std::string bytes(1000, '\x16');
    CHECK(s.feed(bytes) == status::ok);
    CHECK(s.input_space() == 24);
    CHECK(s.feed(std::string_view("0123456789012345678901234")) == status::error);
    CHECK(s.reason().find("input cap") != std::string_view::npos);
    CHECK(s.handshake() == status::error);
  }

  TEST_CASE("shutdown sends close_notify; the client's close_notify reads as closed") {
    auto ctx = tls::context::load(test_pki().options());
    SUBCASE("server closes") {
      client c;
      tls::session s(*ctx);
      connected(c, s);
      transfer(c, s);
      CHECK(s.shutdown() == status::ok);
      CHECK(s.has_output());
      transfer(c, s);
      std::string got;
      bool zero_return = false;
      CHECK_FALSE(c.read_all(got, &zero_return));
      CHECK(zero_return);
    }
    SUBCASE("client closes") {
      client c;
      tls::session s(*ctx);
      connected(c, s);
      CHECK(SSL_shutdown(c.ssl) == 0);
      transfer(c, s);
      char buf[64];
      CHECK(s.read(buf).st == status::closed);
    }
    SUBCASE("before the handshake there is nothing to send") {
      tls::session s(*ctx);
      CHECK(s.shutdown() == status::closed);
      CHECK_FALSE(s.has_output());
    }
  }

  TEST_CASE("a moved session keeps working") {
    auto ctx = tls::context::load(test_pki().options());
    client c({.max_version = TLS1_2_VERSION});
    tls::session first(*ctx);
    connected(c, first);
    tls::session s(std::move(first));
    CHECK(first.handshake() == status::error);  // NOLINT(bugprone-use-after-move): what a moved-from one says
    CHECK_FALSE(first.has_output());
    CHECK(server_to_client(c, s, "moved", nullptr) == "moved");
    // The info callback follows the move: renegotiation is still caught.
    REQUIRE(SSL_renegotiate(c.ssl) == 1);
    (void)c.step_handshake();
    transfer(c, s);
    char buf[64];
    CHECK(s.read(buf).st == status::error);
    CHECK(s.reason().find("renegotiation") != std::string_view::npos);
  }
}

TEST_SUITE("tls::ktls") {
  TEST_CASE("ktls_fit: TLS 1.2 AEAD both ways, TLS 1.3 send only") {
    auto ctx = tls::context::load(test_pki().options());
    int v = 0;
    bool recv = false;
    SUBCASE("1.2") { v = TLS1_2_VERSION; recv = true; }
    SUBCASE("1.3") { v = TLS1_3_VERSION; recv = false; }
    client c({.max_version = v});
    tls::session s(*ctx);
    CHECK_FALSE(tls::ktls_fit(s).send);
    connected(c, s);
    auto fit = tls::ktls_fit(s);
    CHECK(fit.send);
    CHECK(fit.recv == recv);
  }

  TEST_CASE("ktls_available answers, with a reason when it is no") {
    std::string why;
    bool yes = tls::ktls_available(&why);
    MESSAGE("kTLS available: " << (yes ? "yes" : "no: " + why));
    CHECK((yes || !why.empty()));
  }
}

