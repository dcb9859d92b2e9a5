// The estimator against the real Qwen tokenizer's counts
// (tests/fixtures/tokenizer/corpus.json, made by tools/gen-token-fixture).
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "sluice/quota/estimate.hpp"

using sluice::quota::admission_cost;
using sluice::quota::estimate_input_tokens;

TEST_SUITE("quota::estimate") {
  TEST_CASE("the estimate is within 25% of the Qwen tokenizer for every corpus text, per class") {
    simdjson::ondemand::parser parser;
    auto json = simdjson::padded_string::load(SLUICE_TOKENIZER_FIXTURE);
    REQUIRE(json.error() == simdjson::SUCCESS);
    auto doc = parser.iterate(json.value());
    std::map<std::string, std::vector<double>> errors;  // class → relative errors
    size_t entries = 0;
    for (auto entry : doc["entries"].get_array()) {
      const std::string name(entry["name"].get_string().value());
      const std::string cls(entry["class"].get_string().value());
      const std::string text(entry["text"].get_string().value());
      const auto tokens = static_cast<double>(entry["tokens"].get_uint64().value());
      const auto estimate = static_cast<double>(estimate_input_tokens(text));
      const double error = (estimate - tokens) / tokens;
      INFO(name, ": estimate ", estimate, " real ", tokens);
      CHECK(std::fabs(error) <= 0.25);
      errors[cls].push_back(error);
      ++entries;
    }
    CHECK(entries >= 40);
    for (const char* cls : {"en", "zh", "code", "json"}) {
      auto& e = errors[cls];
      REQUIRE(e.size() >= 8);
      std::sort(e.begin(), e.end());
      double sum = 0, abs_sum = 0;
      for (double x : e) {
        sum += x;
        abs_sum += std::fabs(x);
      }
      const double n = static_cast<double>(e.size());
      std::printf("estimator %-4s n=%2zu  min %+6.1f%%  median %+6.1f%%  max %+6.1f%%  mean %+6.1f%%  mean|err| %5.1f%%\n",
                  cls, e.size(), e.front() * 100, e[e.size() / 2] * 100, e.back() * 100, sum / n * 100,
                  abs_sum / n * 100);
    }
  }

  TEST_CASE("pure ASCII (costed from bit masks, 64 bytes at a time) gets what the rules give run by run") {
    // The rules of estimate.hpp, applied plainly to ASCII text: split into
    // runs of one class (space and newline together), cost each run.
    const auto plain = [](std::string_view t) {
      const auto cls = [](char c) {
        const auto u = static_cast<unsigned char>(c);
        if ((u | 0x20) >= 'a' && (u | 0x20) <= 'z') return 'L';
        if (u >= '0' && u <= '9') return 'D';
        if (u == ' ' || u == '\t' || u == '\n' || u == '\r') return 'W';
        return 'P';
      };
      uint64_t cost = 0;
      for (size_t i = 0; i < t.size();) {
        const char k = cls(t[i]);
        size_t j = i;
        bool newline = false;
        while (j < t.size() && cls(t[j]) == k) newline |= t[j] == '\n' || t[j] == '\r', ++j;
        const uint64_t n = j - i;
        const bool letter_next = j < t.size() && cls(t[j]) == 'L';
        if (k == 'L') cost += 62 + 5 * (n > 5 ? n - 5 : 0);
        if (k == 'D') cost += 64 * n;
        if (k == 'P' && n - (letter_next ? 1 : 0) > 0) cost += 75 + 9 * (n - (letter_next ? 1 : 0) - 1);
        if (k == 'W' && (newline || n >= 2 || j == t.size())) cost += 75;
        i = j;
      }
      return t.empty() ? 0 : std::max<uint64_t>(1, cost / 64);
    };
    std::mt19937_64 rng(1234);
    const std::string_view pools[] = {"ab cd\n", "a{\":,.}0", " \t\r\n", "x  y!", "0123456789 ", "abcdefghijk"};
    for (int i = 0; i < 20000; ++i) {
      const std::string_view pool = pools[rng() % std::size(pools)];
      std::string t(rng() % 300, ' ');
      for (char& c : t) c = (rng() & 7) == 0 ? static_cast<char>(rng() % 128) : pool[rng() % pool.size()];
      CAPTURE(t);
      REQUIRE(estimate_input_tokens(t) == plain(t));
      // Both builds of the fast path, whichever one this CPU runs.
      REQUIRE(sluice::quota::detail::ascii_estimate(t, false) == plain(t));
      if (sluice::quota::detail::has_popcnt()) REQUIRE(sluice::quota::detail::ascii_estimate(t, true) == plain(t));
    }
  }

  TEST_CASE("the estimate of an empty text is zero and of any other text at least one") {
    CHECK(estimate_input_tokens("") == 0);
    CHECK(estimate_input_tokens(" ") == 1);
    CHECK(estimate_input_tokens("a") == 1);
  }

  TEST_CASE("digits count one token each, as the Qwen pre-tokenizer splits them") {
    CHECK(estimate_input_tokens("1234567890") == 10);
  }

  TEST_CASE("truncated and malformed UTF-8 is counted, never overrun") {
    const char bad[] = {'\xe4', '\xbd'};  // first two bytes of a three-byte character
    CHECK(estimate_input_tokens(std::string_view(bad, 2)) >= 1);
    const char stray[] = {'\x80', '\x80', '\x80'};
    CHECK(estimate_input_tokens(std::string_view(stray, 3)) == 3);
  }

  TEST_CASE("admission cost weighs input and output and saturates instead of wrapping") {
    CHECK(admission_cost(10, 1000, 1, 2) == 2010);
    CHECK(admission_cost(10, 1000, 3, 5) == 5030);
    CHECK(admission_cost(UINT64_MAX / 2, UINT64_MAX / 2, 1, 2) == UINT64_MAX);
    CHECK(admission_cost(UINT64_MAX, 0, 2, 1) == UINT64_MAX);
  }
}

TEST_SUITE("quota::estimate_request_tokens") {
  TEST_CASE("a request is estimated from its text: an image's base64 costs image_tokens, not its bytes") {
    sluice::openai::request_reader reader(64u << 20);
    auto estimate = [&](const std::string& body) {
      sluice::openai::request_fields f;
      sluice::openai::request_error e;
      REQUIRE(reader.read(sluice::openai::endpoint::chat_completions, body.data(), body.size(), 1 << 20, f, e));
      return sluice::quota::estimate_request_tokens(*f.text, f.message_count, 1000);
    };
    const std::string text_only =
        R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"What is in this picture?"}]}]})";
    auto with_image = [](size_t base64_bytes) {
      return R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"What is in this picture?"},)"
             R"({"type":"image_url","image_url":{"url":"data:image/png;base64,)" +
             std::string(base64_bytes, 'A') + R"("}}]}]})";
    };
    const uint64_t base = estimate(text_only);
    CHECK(base > 4);
    CHECK(base < 20);
    CHECK(estimate(with_image(100)) == base + 1000);
    CHECK(estimate(with_image(2 << 20)) == base + 1000);  // 2 MiB of base64: the same
  }

  TEST_CASE("JSON syntax and keys are not counted; each message adds its template tokens") {
    sluice::openai::request_reader reader(1u << 20);
    sluice::openai::request_fields f;
    sluice::openai::request_error e;
    const std::string one = R"({"model":"m","messages":[{"role":"user","content":"hello"}]})";
    REQUIRE(reader.read(sluice::openai::endpoint::chat_completions, one.data(), one.size(), 1 << 20, f, e));
    const uint64_t a = sluice::quota::estimate_request_tokens(*f.text, f.message_count, 0);
    CHECK(a == sluice::quota::estimate_input_tokens("hello") + 4);
    const std::string two =
        R"({"model":"m","messages":[{"role":"system","content":"hello"},{"role":"user","content":"hello"}]})";
    REQUIRE(reader.read(sluice::openai::endpoint::chat_completions, two.data(), two.size(), 1 << 20, f, e));
    CHECK(sluice::quota::estimate_request_tokens(*f.text, f.message_count, 0) == 2 * a);
  }
}
