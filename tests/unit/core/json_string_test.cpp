// The one JSON string escaper: its escapes, U+FFFD per maximal ill-formed
// subpart, whole pieces only when out of room, and on any bytes at all an
// output that is valid UTF-8 with no raw control byte, sized as predicted.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sluice/core/json_string.hpp"

namespace {

std::string escaped(std::string_view s) {
  std::string out(s.size() * 6, '\0');
  out.resize(sluice::json_escape(out.data(), out.size(), s));
  return out;
}

constexpr std::string_view fffd = "\xEF\xBF\xBD";

// A fixed-seed xorshift64: the same draws on every run.
struct xorshift {
  uint64_t state;
  uint64_t operator()() noexcept {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  }
};

}  // namespace

TEST_SUITE("core::json_string") {
  TEST_CASE("quotes, backslashes and control characters are escaped; the short forms where JSON has them") {
    CHECK(escaped("say \"hi\" \\ o/") == R"(say \"hi\" \\ o/)");
    CHECK(escaped("\b\f\n\r\t") == R"(\b\f\n\r\t)");
    CHECK(escaped(std::string_view("\x00\x01\x1f", 3)) == R"(\u0000\u0001\u001f)");
    CHECK(escaped("\x7f") == "\x7f");  // DEL is not a JSON control character
    CHECK(escaped("naïve 😀 中文") == "naïve 😀 中文");
  }

  TEST_CASE("each maximal ill-formed subpart becomes one U+FFFD") {
    CHECK(escaped("ok\xE2\x82") == "ok" + std::string(fffd));                  // cut at the end
    CHECK(escaped("\xE2\x82!") == std::string(fffd) + "!");                    // cut before ASCII
    CHECK(escaped("\xF0\x9F\x98") == std::string(fffd));                       // 3 of 4 bytes
    CHECK(escaped("\xC0\xAF") == std::string(fffd) + std::string(fffd));       // overlong: two
    CHECK(escaped("\xED\xA0\x80") == std::string(fffd) + std::string(fffd) + std::string(fffd));  // surrogate
    CHECK(escaped("\x80\x80") == std::string(fffd) + std::string(fffd));       // lone continuations
    CHECK(escaped("\xF4\x90\x80\x80").size() == 4 * fffd.size());              // above U+10FFFF
    CHECK(escaped("\xFF") == fffd);
  }

  TEST_CASE("out of room: whole escapes and whole characters only, and consumed says how far") {
    char buf[16];
    size_t consumed = 0;
    CHECK(sluice::json_escape(buf, 5, "ab\x01" "cd", consumed) == 2);  // \u0001 needs 6
    CHECK(consumed == 2);
    CHECK(sluice::json_escape(buf, 3, "a\"b", consumed) == 3);
    CHECK(consumed == 2);
    CHECK(sluice::json_escape(buf, 4, "a😀", consumed) == 1);          // the emoji needs 4
    CHECK(consumed == 1);
    CHECK(sluice::json_escape(buf, 0, "abc", consumed) == 0);
    CHECK(consumed == 0);
    // In pieces: the same bytes as in one go.
    const std::string text = "a\"😀\n\xE2\x82 tail";
    std::string pieces;
    for (size_t at = 0; at < text.size();) {
      char small[7];
      const size_t n = sluice::json_escape(small, sizeof small, std::string_view(text).substr(at), consumed);
      REQUIRE(consumed > 0);
      pieces.append(small, n);
      at += consumed;
    }
    CHECK(pieces == escaped(text));
    // A long plain run in small pieces (a 4 MiB delta written into a
    // bounded frame): each piece takes exactly its room, and an escape at a
    // piece's edge waits whole for the next.
    const std::string run = std::string(1023, 'p') + "\"" + std::string(1000, 'q');
    std::string joined;
    std::vector<size_t> took;
    for (size_t at = 0; at < run.size();) {
      char small[64];
      const size_t n = sluice::json_escape(small, sizeof small, std::string_view(run).substr(at), consumed);
      REQUIRE(consumed > 0);
      joined.append(small, n);
      took.push_back(consumed);
      at += consumed;
    }
    CHECK(joined == escaped(run));
    CHECK(took.front() == 64);
    CHECK(took[15] == 63);  // 63 plain bytes; the quote's 2 do not fit in the last one
    CHECK(took[16] == 63);  // the quote, then 62 of the next run
  }

  TEST_CASE("any bytes: valid UTF-8 out, no raw control byte, at most 6 bytes a byte, sized as predicted") {
    xorshift next{0x9E3779B97F4A7C15ull};
    for (int round = 0; round < 20000; ++round) {
      std::string s(next() % 24, '\0');
      for (char& c : s) {
        // Mostly the bytes around UTF-8's edges.
        static constexpr unsigned char edges[] = {0x00, 0x1f, '"', '\\', 'a', 0x7f, 0x80, 0xbf, 0xc0, 0xc2,
                                                  0xdf, 0xe0, 0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff, 0x9f, 0xa0};
        c = static_cast<char>(next() % 3 == 0 ? next() & 0xff : edges[next() % sizeof edges]);
      }
      const std::string out = escaped(s);
      CHECK(out.size() == sluice::json_escaped_size(s));
      CHECK(out.size() <= s.size() * 6);
      const auto* u = reinterpret_cast<const unsigned char*>(out.data());
      for (size_t i = 0; i < out.size();) {
        REQUIRE(u[i] >= 0x20);
        const int k = sluice::utf8_sequence(u + i, out.size() - i);
        REQUIRE(k > 0);
        if (u[i] == '\\') {
          REQUIRE(i + 1 < out.size());
          i += 2;  // the escaped byte: '"', '\\', a short form or 'u'
          continue;
        }
        REQUIRE(u[i] != '"');
        i += static_cast<size_t>(k);
      }
    }
  }

  TEST_CASE("any room: the output and `consumed` are a plain piece-by-piece reading's, special bytes near the room's end") {
    // The model: each character in turn -- a plain byte as itself, another
    // ASCII byte as its escape, a UTF-8 sequence as its bytes, an
    // ill-formed subpart as U+FFFD -- while the whole piece fits.
    const auto model = [](std::string_view s, size_t cap, size_t& consumed) {
      std::string out;
      size_t i = 0;
      while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        std::string piece;
        size_t took = 1;
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
          piece = std::string(1, static_cast<char>(c));
        } else if (c < 0x80) {
          piece = escaped(std::string_view(s.data() + i, 1));
        } else {
          const int k = sluice::utf8_sequence(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i);
          piece = k > 0 ? std::string(s.substr(i, static_cast<size_t>(k))) : std::string(fffd);
          took = static_cast<size_t>(k > 0 ? k : -k);
        }
        if (out.size() + piece.size() > cap) break;
        out += piece;
        i += took;
      }
      consumed = i;
      return out;
    };
    xorshift next{0x243F6A8885A308D3ull};
    static constexpr unsigned char specials[] = {0x00, 0x01, 0x1f, '"', '\\', '\n', 0x7f, 0x80, 0xc3, 0xa9, 0xe2, 0xff};
    for (int round = 0; round < 6000; ++round) {
      std::string s(next() % 61, '\0');
      for (size_t k = 0; k < s.size(); ++k) s[k] = static_cast<char>(' ' + next() % 95);
      // None, one or two special bytes, often in the last sixteen.
      for (uint64_t k = next() % 3; k > 0 && !s.empty(); --k) {
        const size_t at = next() % 2 == 0 && s.size() > 16 ? s.size() - 1 - next() % 16 : next() % s.size();
        s[at] = static_cast<char>(specials[next() % sizeof specials]);
      }
      const size_t full = sluice::json_escaped_size(s);
      for (size_t cap = 0; cap <= full + 1; ++cap) {
        // From a heap block of exactly the string's bytes, into one of
        // exactly `cap`: a read or write past either fails under ASan.
        const std::unique_ptr<char[]> in(new char[s.empty() ? 1 : s.size()]);
        std::copy_n(s.data(), s.size(), in.get());
        const std::unique_ptr<char[]> out(new char[cap == 0 ? 1 : cap]);
        size_t consumed = 0, want_consumed = 0;
        const size_t n = sluice::json_escape(out.get(), cap, std::string_view(in.get(), s.size()), consumed);
        const std::string want = model(s, cap, want_consumed);
        CAPTURE(s);
        CAPTURE(cap);
        REQUIRE(std::string(out.get(), n) == want);
        REQUIRE(consumed == want_consumed);
      }
    }
  }

  TEST_CASE("long plain runs, sixteen bytes a turn: one special byte at every place, and every room") {
    const std::string specials[] = {"\"", "\\", "\n", std::string(1, '\x01'), "\x1f", "\x7f", "\x80", "\xc3\xa9", "\xff"};
    for (size_t len = 0; len <= 80; ++len) {
      std::string plain;
      for (size_t i = 0; i < len; ++i) plain.push_back(static_cast<char>(' ' + (i * 7) % 95));  // printable, '"' and '\\' among them
      std::string clean = plain;
      for (char& c : clean) c = c == '"' || c == '\\' ? 'q' : c;
      CHECK(escaped(clean) == clean);
      for (size_t at = 0; at <= len; ++at) {
        for (const std::string& sp : specials) {
          const std::string in = clean.substr(0, at) + sp + clean.substr(at);
          CAPTURE(len);
          CAPTURE(at);
          REQUIRE(escaped(in) == clean.substr(0, at) + escaped(sp) + clean.substr(at));
        }
      }
      const std::string want = escaped(plain);  // the same through the byte loop? each byte alone
      std::string bytewise;
      for (char c : plain) bytewise += escaped(std::string(1, c));
      CHECK(want == bytewise);
      // Out of room: as many plain bytes as fit, and consumed says so.
      for (size_t cap = 0; cap <= len; ++cap) {
        std::string out(cap, '\0');
        size_t consumed = 0;
        REQUIRE(sluice::json_escape(out.data(), cap, clean, consumed) == cap);
        REQUIRE(consumed == cap);
        REQUIRE(out == clean.substr(0, cap));
      }
    }
  }
}
