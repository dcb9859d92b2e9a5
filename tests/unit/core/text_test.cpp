#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>

#include "sluice/core/text.hpp"

using sluice::text_writer;

TEST_SUITE("core::text_writer") {
  TEST_CASE("a put that does not fit writes nothing, moves nothing, and every later put is refused") {
    char buf[16];
    std::memset(buf, '#', sizeof buf);
    text_writer w(buf, 10);
    w.put("abcdef");
    CHECK(w.ok);
    w.put("ghijk");  // 5 > the 4 left
    CHECK_FALSE(w.ok);
    CHECK(w.p == buf + 6);  // [buf, p) is what was written, not the whole buffer
    w.put("x");  // would fit, but the text already has a hole
    w.put('y');
    w.put_int(7);
    w.put_hex_min(0xab);
    CHECK(w.p == buf + 6);
    CHECK(std::string_view(buf, static_cast<size_t>(w.p - buf)) == "abcdef");
    CHECK(buf[6] == '#');
  }

  TEST_CASE("a head built of puts never carries bytes nobody wrote, whatever fits") {
    // The shape of a backend request's head: fixed text, then an id of any
    // length up to the writer's room and past it.
    for (size_t id_len = 0; id_len < 80; ++id_len) {
      CAPTURE(id_len);
      char buf[64];
      std::memset(buf, 0, sizeof buf);  // anything unwritten would show as NUL
      text_writer w(buf, sizeof buf);
      w.put("\r\nx-request-id: ");
      w.put(std::string_view("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", id_len));
      w.put("\r\nx-forwarded-for: ");
      const std::string_view out(buf, static_cast<size_t>(w.p - buf));
      CHECK(out.find('\0') == std::string_view::npos);
      CHECK(w.ok == (16 + id_len + 19 <= sizeof buf));
    }
  }

  TEST_CASE("iequals: every pair of bytes at every place of strings of 1-24 bytes, as the plain rule says") {
    const auto lower = [](unsigned char c) { return c >= 'A' && c <= 'Z' ? static_cast<unsigned char>(c | 0x20) : c; };
    size_t equal = 0;
    for (size_t n = 1; n <= 24; ++n) {
      std::string a(n, 'k'), b(n, 'K');
      REQUIRE(sluice::iequals(a, b));
      for (size_t at = 0; at < n; ++at) {
        for (unsigned x = 0; x < 256; ++x) {
          for (unsigned y = 0; y < 256; ++y) {
            a[at] = static_cast<char>(x);
            b[at] = static_cast<char>(y);
            const bool want = lower(static_cast<unsigned char>(x)) == lower(static_cast<unsigned char>(y));
            if (sluice::iequals(a, b) != want) {
              CAPTURE(n);
              CAPTURE(at);
              CAPTURE(x);
              CAPTURE(y);
              REQUIRE(sluice::iequals(a, b) == want);
            }
            equal += want;
          }
        }
        a[at] = 'k';
        b[at] = 'K';
      }
    }
    CHECK(equal == 300 * (256 + 52));  // each place: 256 equal pairs and 52 of a letter in two cases
    CHECK_FALSE(sluice::iequals("content-type", "content-typ"));
    CHECK(sluice::iequals("Content-Type", "content-type"));
    CHECK_FALSE(sluice::iequals("content-type", "content_type"));
    CHECK_FALSE(sluice::iequals("x-request-id", "x\rrequest-id"));  // CR is not '-' in another case
  }

  TEST_CASE("find_bytes and rfind_bytes: memmem's and string_view::rfind's answers for needles of 1-24 bytes in haystacks of 0-100, found or not") {
    std::mt19937 rng(7);
    const auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
    constexpr std::string_view bytes = "ab\"f_:";
    size_t found = 0, found_twice = 0;
    for (int round = 0; round < 200000; ++round) {
      std::string h(pick(101), ' ');
      for (char& c : h) c = bytes[pick(pick(2) == 0 ? 2 : bytes.size())];
      std::string needle;
      if (!h.empty() && pick(2) == 0) {
        const size_t at = pick(h.size());
        needle = h.substr(at, 1 + pick(std::min<size_t>(24, h.size() - at)));
        if (pick(3) == 0) needle.back() = bytes[pick(bytes.size())];
      } else {
        needle.assign(1 + pick(24), ' ');
        for (char& c : needle) c = bytes[pick(2)];
      }
      // Exactly the haystack's bytes, so a read past it is ASan's to see.
      const auto buf = std::make_unique<char[]>(h.size());
      std::memcpy(buf.get(), h.data(), h.size());
      const void* want = ::memmem(buf.get(), h.size(), needle.data(), needle.size());
      const char* got = sluice::find_bytes(buf.get(), h.size(), needle);
      const size_t last = h.rfind(needle);
      const char* want_last = last == std::string::npos ? nullptr : buf.get() + last;
      const char* got_last = sluice::rfind_bytes(buf.get(), h.size(), needle);
      if (got != want || got_last != want_last) {
        CAPTURE(h);
        CAPTURE(needle);
        REQUIRE(got == want);
        REQUIRE(got_last == want_last);
      }
      found += want != nullptr;
      found_twice += want != nullptr && last != static_cast<size_t>(static_cast<const char*>(want) - buf.get());
    }
    CHECK(found > 50000);
    CHECK(found < 150000);
    CHECK(found_twice > 20000);  // the last place is not the first: rfind's own answer is asked
  }

  TEST_CASE("hex digits: the one table, both cases, every other byte refused") {
    for (int c = 0; c < 256; ++c) {
      const char ch = static_cast<char>(c);
      const int want = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      CHECK(sluice::hex_digit(ch) == want);
      CHECK((sluice::k_hex_value[static_cast<unsigned char>(c)] < 16) == (want >= 0));
    }
  }

  TEST_CASE("integers fit or are refused whole") {
    char buf[4];
    text_writer w(buf, sizeof buf);
    w.put_int(12345);
    CHECK_FALSE(w.ok);
    CHECK(w.p == buf);
    text_writer v(buf, sizeof buf);
    v.put_int(1234);
    CHECK(v.ok);
    CHECK(std::string_view(buf, 4) == "1234");
  }
}
