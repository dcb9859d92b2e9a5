// valid_host(): the Host values a request may carry (RFC 9112 §3.2, RFC 3986
// §3.2.2-3), one row per value. A new edge case is a new row.
#include <doctest/doctest.h>

#include <string_view>

#include "head_scan.hpp"

using sluice::http::detail::valid_host;

namespace {

struct host_case {
  std::string_view value;
  bool valid;
};

constexpr host_case k_hosts[] = {
    // reg-names and IPv4 addresses, with and without a port.
    {"a", true},
    {"localhost", true},
    {"api.example.com", true},
    {"API.Example.COM.", true},
    {"xn--bcher-kva.example", true},
    {"under_score-and~tilde", true},
    {"sub!$&'()*+,;=delims", true},
    {"%41pct", true},
    {"127.0.0.1", true},
    {"999.1.1.1", true},  // a reg-name by its syntax
    {"a:0", true},
    {"a:80", true},
    {"a:080", true},
    {"127.0.0.1:65535", true},
    // IP literals.
    {"[::1]", true},
    {"[::1]:443", true},
    {"[::]", true},
    {"[1::]", true},
    {"[2001:db8::8a2e:370:7334]", true},
    {"[1:2:3:4:5:6:7:8]", true},
    {"[1:2:3:4:5:6:7::]", true},
    {"[::2:3:4:5:6:7:8]", true},
    {"[::ffff:192.0.2.1]:8080", true},
    {"[1:2:3:4:5:6:1.2.3.4]", true},
    {"[ABCD:ef01::]", true},
    {"[v1.fe80::a+en1]", true},

    // Empty parts.
    {"", false},
    {":80", false},
    {"a:", false},
    {"[]", false},
    {"[::1]:", false},
    // Bytes no host holds.
    {"a b", false},
    {"a\tb", false},
    {" a", false},
    {"user@a", false},
    {"user:pw@a", false},
    {"a/b", false},
    {"a?b", false},
    {"a#b", false},
    {"a\"b", false},
    {"h\xc3\xa9.example", false},  // UTF-8: IDNs travel as xn-- labels
    {"a%4", false},
    {"a%zz", false},
    {"%", false},
    // Ports.
    {"a:abc", false},
    {"a:8o", false},
    {"a:-1", false},
    {"a:+80", false},
    {"a:65536", false},
    {"a:99999", false},
    {"a:000080", false},
    {"a:80:80", false},
    {"a: 80", false},
    // IP literals.
    {"[::1", false},
    {"[::1]x", false},
    {"[::1]]", false},
    {"::1", false},  // unbracketed
    {"[1:2:3:4:5:6:7:8:9]", false},
    {"[1:2:3:4:5:6:7]", false},
    {"[::1:2:3:4:5:6:7:8]", false},
    {"[1::2::3]", false},
    {"[12345::]", false},
    {"[:1]", false},
    {"[1:]", false},
    {"[:::]", false},
    {"[g::1]", false},
    {"[1.2.3.4]", false},
    {"[::1.2.3.256]", false},
    {"[::01.2.3.4]", false},
    {"[::1.2.3]", false},
    {"[::1.2.3.4:5]", false},
    {"[1:2:3:4:5:6:7:1.2.3.4]", false},
    {"[fe80::1%25eth0]", false},  // zone IDs (RFC 6874, withdrawn by RFC 9844)
    {"[v1.]", false},
    {"[vz.x]", false},
    {"[v.x]", false},
    {"[v1.a b]", false},
};

}  // namespace

TEST_SUITE("http::head_scan") {
  TEST_CASE("valid_host accepts host[:port] and nothing else") {
    for (const host_case& c : k_hosts) {
      CAPTURE(c.value);
      CHECK(valid_host(c.value) == c.valid);
    }
  }
}
