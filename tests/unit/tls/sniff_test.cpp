// The first-bytes sniffing of tls.hpp and the canned answers for the wrong port.
#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "sluice/tls/tls.hpp"
#include "tls_peer.hpp"

using namespace tls_test;  // NOLINT(google-build-using-namespace): the test's own helpers

TEST_SUITE("tls::sniff") {
  TEST_CASE("a ClientHello on the plaintext port") {
    struct row {
      std::string bytes;
      tls::sniff expect;
    };
    const row rows[] = {
        {"", tls::sniff::need_more},
        {"\x16", tls::sniff::need_more},
        {"\x16\x03", tls::sniff::need_more},
        {std::string("\x16\x03\x01\x02\x00", 5), tls::sniff::yes},
        {std::string("\x16\x03\x00", 3), tls::sniff::yes},
        {std::string("\x16\x03\x04", 3), tls::sniff::yes},
        {std::string("\x16\x03\x05", 3), tls::sniff::no},
        {std::string("\x16\x02\x01", 3), tls::sniff::no},
        {std::string("\x17\x03\x03", 3), tls::sniff::no},
        {"GET / HTTP/1.1\r\n", tls::sniff::no},
        {"PRI * HTTP/2.0\r\n", tls::sniff::no},
    };
    for (const auto& r : rows) {
      INFO("bytes: ", r.bytes.size());
      CHECK(tls::looks_like_tls_client_hello(r.bytes) == r.expect);
    }
  }

  TEST_CASE("plain HTTP on the TLS port") {
    struct row {
      std::string bytes;
      tls::sniff expect;
    };
    const row rows[] = {
        {"", tls::sniff::need_more},
        {"G", tls::sniff::need_more},
        {"POS", tls::sniff::need_more},
        {"GET / HTTP/1.1\r\n", tls::sniff::yes},
        {"POST /v1/chat/completions HTTP/1.1", tls::sniff::yes},
        {"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", tls::sniff::yes},
        {"OPTIONS * HTTP/1.1", tls::sniff::yes},
        {" GET", tls::sniff::no},
        {"get / HTTP/1.1", tls::sniff::no},
        {std::string("\x16\x03\x01", 3), tls::sniff::no},
        {"ABCDEFGHIJKLMNOPQ", tls::sniff::no},  // longer than any method
        {"ABCDEFGHIJKLMNOP", tls::sniff::need_more},
    };
    for (const auto& r : rows) {
      INFO("bytes: ", r.bytes);
      CHECK(tls::looks_like_plain_http(r.bytes) == r.expect);
    }
  }

  TEST_CASE("the canned answers are well-formed") {
    std::string_view http = tls::k_plain_http_on_tls_port_response;
    size_t head_end = http.find("\r\n\r\n");
    REQUIRE(head_end != std::string_view::npos);
    CHECK(http.substr(0, 25) == "HTTP/1.1 400 Bad Request\r");
    CHECK(http.find("content-length: " + std::to_string(http.size() - head_end - 4)) != std::string_view::npos);
    std::string_view alert = tls::k_tls_on_plain_port_alert;
    REQUIRE(alert.size() == 7);
    CHECK(alert[0] == '\x15');
    CHECK(alert[5] == '\x02');  // fatal
  }

  TEST_CASE("a plain request fed to a session fails it at once") {
    auto ctx = tls::context::load(test_pki().options());
    tls::session s(*ctx);
    REQUIRE(s.feed(std::string_view("GET / HTTP/1.1\r\nHost: x\r\n\r\n")) == status::ok);
    CHECK(s.handshake() == status::error);
    CHECK(!s.reason().empty());
  }
}
