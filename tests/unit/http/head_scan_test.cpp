// valid_host(): the Host values a request may carry (RFC 9112 §3.2, RFC 3986
// §3.2.2-3), one row per value. A new edge case is a new row.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "head_scan.hpp"

using sluice::http::detail::valid_host;
namespace hd = sluice::http::detail;
using namespace std::literals;

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

// What scan_head() must answer for a head, read from the rules line by
// line with plain loops: the state, the error, and the index of the field
// lines. The order of the checks is the scanner's documented one: a line's
// length (its CR counted) before its bare LF, then its bytes.
struct scan_answer {
  hd::scan_state state = hd::scan_state::need_more;
  hd::scan_error error = hd::scan_error::none;
  uint32_t head_bytes = 0;
  uint16_t fields = 0;
  bool name_not_token = false;
  std::vector<sluice::http::field_ref> index;
};

// `h`: a request line of a method "GET", SP and bytes that are no CTL, then
// field lines.
scan_answer by_the_rules(std::string_view h, const hd::scan_limits& l) {
  scan_answer a;
  const auto fail = [&a](hd::scan_error e) {
    a.state = hd::scan_state::failed;
    a.error = e;
    return a;
  };
  // Nothing past the head's limit is looked at.
  const std::string_view seen = h.substr(0, std::min<size_t>(h.size(), l.head_bytes_max));
  const auto open_line = [&](size_t b, uint32_t max, hd::scan_error too_long) {
    if (seen.size() - b > size_t{max} + 1) return fail(too_long);
    if (h.size() >= l.head_bytes_max) return fail(hd::scan_error::head_too_large);
    return a;
  };
  const size_t start_lf = seen.find('\n');
  if (start_lf == std::string_view::npos) return open_line(0, l.start_line_bytes_max, hd::scan_error::start_line_too_long);
  if (start_lf > size_t{l.start_line_bytes_max} + 1) return fail(hd::scan_error::start_line_too_long);
  if (h[start_lf - 1] != '\r') return fail(hd::scan_error::bare_lf);
  const size_t first = start_lf + 1;  // the first field line
  size_t b = first;
  for (;;) {
    const size_t lf = seen.find('\n', b);
    if (lf == std::string_view::npos) return open_line(b, l.field_line_bytes_max, hd::scan_error::field_line_too_long);
    if (lf - b > size_t{l.field_line_bytes_max} + 1) return fail(hd::scan_error::field_line_too_long);
    if (lf == b || h[lf - 1] != '\r') return fail(hd::scan_error::bare_lf);
    const size_t n = lf - 1 - b;
    if (n == 0) {
      a.state = hd::scan_state::complete;
      a.head_bytes = static_cast<uint32_t>(lf + 1);
      return a;
    }
    if (++a.fields > l.fields_max) return fail(hd::scan_error::too_many_fields);
    const std::string_view line = h.substr(b, n);
    if (line[0] == ' ' || line[0] == '\t') return fail(hd::scan_error::obs_fold);
    for (char ch : line) {
      const auto c = static_cast<unsigned char>(ch);
      if ((c < 0x20 && c != '\t') || c == 0x7f) {
        return fail(c == '\r' ? hd::scan_error::bare_cr : c == 0 ? hd::scan_error::nul : hd::scan_error::ctl_in_value);
      }
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) return fail(hd::scan_error::missing_colon);
    if (colon == 0) return fail(hd::scan_error::empty_name);
    bool token = true, ws = false;
    for (size_t i = 0; i < colon; ++i) {
      token &= hd::is_tchar(static_cast<unsigned char>(line[i]));
      ws |= line[i] == ' ' || line[i] == '\t';
    }
    if (!token && ws) return fail(hd::scan_error::space_before_colon);
    a.name_not_token |= !token;
    size_t vb = colon + 1, ve = n;
    while (vb < ve && (line[vb] == ' ' || line[vb] == '\t')) ++vb;
    while (ve > vb && (line[ve - 1] == ' ' || line[ve - 1] == '\t')) --ve;
    if (a.index.size() < sluice::http::k_indexed_fields) {
      const size_t off = b - first;
      a.index.push_back({static_cast<uint16_t>(off + colon), static_cast<uint16_t>(off + vb),
                         static_cast<uint16_t>(off + ve), static_cast<uint16_t>(off + n)});
    }
    b = lf + 1;
  }
}

// A random head: a request line of random length, then lines of a name, a
// separator and a value, each byte now and then one a head may not hold
// where it stands.
std::string random_head(std::mt19937& rng) {
  const auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
  constexpr std::string_view name_bytes = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.";
  // sv: the NUL is one of them.
  constexpr std::string_view odd_bytes = " \t\r\n\x00\x7f\x01\x1f:@\"(!#~|\x80\xff"sv;
  std::string h = "GET /";
  const size_t target_n = pick(4) == 0 ? pick(80) : 0;
  for (size_t k = 0; k < target_n; ++k) h += name_bytes[pick(name_bytes.size())];
  h += " HTTP/1.1";
  h += pick(30) == 0 ? "\n" : "\r\n";
  const size_t lines = pick(14);
  for (size_t i = 0; i < lines; ++i) {
    const auto byte = [&](std::string_view common, unsigned odd_in_1000) {
      if (pick(1000) < odd_in_1000) return odd_bytes[pick(odd_bytes.size())];
      return common[pick(common.size())];
    };
    const size_t name_n = pick(8) == 0 ? pick(70) : pick(28);
    for (size_t k = 0; k < name_n; ++k) h += byte(name_bytes, 15);
    constexpr std::string_view seps[] = {": ", ":", ":  ", ":\t", " :", "", ": \t "};
    h += seps[pick(10) < 7 ? 0 : pick(std::size(seps))];
    const size_t value_n = pick(6) == 0 ? pick(160) : pick(50);
    for (size_t k = 0; k < value_n; ++k) h += byte("abcdefghij klmnopqrstuvwxyz0123456789/;=,.:\t-", 8);
    if (pick(3) == 0) h += " ";
    h += pick(40) == 0 ? "\n" : "\r\n";
  }
  if (pick(10) != 0) h += "\r\n";
  return h;
}

// scan_head() over the first `len` bytes of `h`, from a buffer of exactly
// that size (ASan sees a read past it), after earlier calls on the
// shorter prefixes `cuts` (in the order a connection reads them).
scan_answer scan(const std::string& h, std::vector<size_t> cuts, const hd::scan_limits& l) {
  hd::head_scan_state s;
  sluice::http::field_index idx;
  hd::scan_state st = hd::scan_state::need_more;
  for (size_t& c : cuts) c = std::min(c, h.size());
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(h.size());
  for (size_t len : cuts) {
    auto buf = std::make_unique<char[]>(len);
    std::memcpy(buf.get(), h.data(), len);
    st = hd::scan_head(s, buf.get(), len, l, &idx);
    if (st != hd::scan_state::need_more) break;
  }
  scan_answer a;
  a.state = st;
  a.error = hd::error_of(s);
  a.head_bytes = s.head_bytes;
  a.fields = s.fields;
  a.name_not_token = s.name_not_token;
  if (st == hd::scan_state::complete) a.index.assign(idx.at, idx.at + idx.n);
  return a;
}

void same(const scan_answer& got, const scan_answer& want) {
  REQUIRE(static_cast<int>(got.state) == static_cast<int>(want.state));
  if (want.state == hd::scan_state::need_more) return;
  CHECK(hd::scan_message(got.error) == hd::scan_message(want.error));
  CHECK(got.fields == want.fields);
  CHECK(got.name_not_token == want.name_not_token);
  if (want.state != hd::scan_state::complete) return;
  CHECK(got.head_bytes == want.head_bytes);
  REQUIRE(got.index.size() == want.index.size());
  for (size_t i = 0; i < want.index.size(); ++i) {
    CAPTURE(i);
    CHECK(got.index[i].colon == want.index[i].colon);
    CHECK(got.index[i].value_begin == want.index[i].value_begin);
    CHECK(got.index[i].value_end == want.index[i].value_end);
    CHECK(got.index[i].cr == want.index[i].cr);
  }
}

}  // namespace

TEST_SUITE("http::head_scan") {
  // The field lines are judged two ways in scan_head(): from one
  // classification of a line's bytes when its LF is within its first 64
  // and the read (most lines), and line by line with memchr otherwise.
  // Both must give the rules' answer, in the rules' order, at every line
  // length and wherever the reads cut the head.
  TEST_CASE("field lines of every length get the rules' answer however the head is cut") {
    // Limits as a shard's, and small ones: a line limit under the 62 bytes
    // the masks judge, and a head limit under the heads drawn.
    const hd::scan_limits limit_sets[] = {
        {16384, 8192, 100, 12, false, hd::k_method_bytes_max},
        {16384, 40, 20, 12, false, hd::k_method_bytes_max},
        {16384, 8192, 45, 6, false, hd::k_method_bytes_max},
        {300, 8192, 8192, 64, false, hd::k_method_bytes_max},
        {90, 60, 61, 64, false, hd::k_method_bytes_max},
    };
    std::mt19937 rng(41);
    size_t byte_errors = 0;  // a CTL, a NUL or a bare CR in a line, over every setting
    for (const hd::scan_limits& limits : limit_sets) {
      CAPTURE(limits.head_bytes_max);
      CAPTURE(limits.field_line_bytes_max);
      size_t complete = 0, failed = 0;
      size_t errors[16] = {};
      for (int round = 0; round < 8000; ++round) {
        const std::string h = random_head(rng);
        CAPTURE(h);
        const scan_answer want = by_the_rules(h, limits);
        complete += want.state == hd::scan_state::complete;
        failed += want.state == hd::scan_state::failed;
        ++errors[static_cast<size_t>(want.error) & 15];
        same(scan(h, {}, limits), want);
        const size_t cut = rng() % (h.size() + 1), cut2 = cut + rng() % (h.size() - cut + 1);
        same(scan(h, {cut, cut2}, limits), want);
        same(scan(h, {1, 16, 17, 18, cut}, limits), want);
      }
      // What the draw reached (not the scanner's doing: a check that the
      // heads drawn cover both answers and the errors the limits bring).
      CHECK(complete > 300);
      CHECK(failed > 2000);
      CHECK(errors[static_cast<size_t>(hd::scan_error::bare_lf)] > 50);
      for (hd::scan_error e : {hd::scan_error::ctl_in_value, hd::scan_error::nul, hd::scan_error::bare_cr}) {
        byte_errors += errors[static_cast<size_t>(e)];
      }
      if (limits.field_line_bytes_max < 62) {
        CHECK(errors[static_cast<size_t>(hd::scan_error::field_line_too_long)] > 500);
      }
      if (limits.head_bytes_max < 1000) CHECK(errors[static_cast<size_t>(hd::scan_error::head_too_large)] > 300);
      if (limits.start_line_bytes_max < 100) CHECK(errors[static_cast<size_t>(hd::scan_error::start_line_too_long)] > 100);
    }
    CHECK(byte_errors > 1000);
  }

  TEST_CASE("the index trims a value's SP and HTAB at both ends, short lines and lines past 64 bytes alike") {
    const std::string pad(70, 'b');
    // {the bytes after "X:", the value the index must give}
    const std::pair<std::string, std::string> cases[] = {
        {"", ""},
        {" ", ""},
        {"\t", ""},
        {"  \t ", ""},
        {"a", "a"},
        {" a", "a"},
        {"a\t", "a"},
        {"\ta", "a"},
        {" a ", "a"},
        {" \t a b \t ", "a b"},
        {"\t" + pad + " \t", pad},
        {" " + pad, pad},
        {pad + " ", pad},
        {std::string(70, ' '), ""},
        {" \t" + std::string(66, ' ') + "a", "a"},
    };
    for (const auto& [after, want] : cases) {
      CAPTURE(after);
      const std::string h = "GET / HTTP/1.1\r\nHost: h\r\nX:" + after + "\r\nZ: z\r\n\r\n";
      const hd::scan_limits limits{16384, 8192, 100, 12, false, hd::k_method_bytes_max};
      const scan_answer got = scan(h, {}, limits);
      REQUIRE(static_cast<int>(got.state) == static_cast<int>(hd::scan_state::complete));
      REQUIRE(got.index.size() == 3);
      const size_t first = h.find("\r\n") + 2;
      const auto value = [&](size_t i) {
        return h.substr(first + got.index[i].value_begin, size_t{got.index[i].value_end} - got.index[i].value_begin);
      };
      CHECK(value(0) == "h");
      CHECK(value(1) == want);
      CHECK(value(2) == "z");
      CHECK(h.substr(first + got.index[1].cr, 2) == "\r\n");
    }
  }

  TEST_CASE("valid_host accepts host[:port] and nothing else") {
    for (const host_case& c : k_hosts) {
      CAPTURE(c.value);
      CHECK(valid_host(c.value) == c.valid);
    }
  }
}
