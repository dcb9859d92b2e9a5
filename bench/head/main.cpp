// bench-head: what a request head costs per request, apart from any I/O --
// the request parser fed bench/harness2's request (the OpenAI Python SDK's
// twelve fields, a ~200-byte body) whole, as one receive hands it over, then
// the head's fields walked once more, as the upstream request is built
// from them.
//
//   build/bench-head [--iterations N]
//
// Prints ns per request, the best of 5 rounds. The proxy-level figure is
// bench/harness2's; this one isolates the head's share.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "sluice/http/request.hpp"

namespace {

std::string harness2_request() {
  const std::string body =
      R"({"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a short poem about the sea and the wind."}],"model":"mock-model","max_tokens":16})";
  std::string r = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n";
  r += "content-type: application/json\r\naccept: application/json\r\nauthorization: Bearer test-key\r\n";
  r += "user-agent: OpenAI/Python 1.54.3\r\nx-stainless-lang: python\r\nx-stainless-package-version: 1.54.3\r\n";
  r += "x-stainless-os: Linux\r\nx-stainless-arch: x64\r\nx-stainless-runtime: CPython\r\n";
  r += "x-stainless-runtime-version: 3.11.7\r\nx-stainless-async: false\r\nx-stainless-retry-count: 0\r\n";
  r += "content-length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 200000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      iterations = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench-head [--iterations N]\n");
      return 2;
    }
  }
  if (iterations <= 0) iterations = 1;
  const std::string req = harness2_request();
  sluice::http::request_parser parser{sluice::http::limits{}};
  sluice::http::request_head head;
  size_t sink = 0;
  const auto round = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) {
      parser.reset();
      if (!parser.parse_head(req.data(), req.size(), head).ok()) std::abort();
      sluice::http::header f;
      for (sluice::http::header_fields it = head.fields(); it.next(f);) sink += f.name.size() + f.value.size();
    }
    const auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / iterations;
  };
  double best = 1e300;
  for (int r = 0; r < 5; ++r) {
    const double t = round();
    if (t < best) best = t;
  }
  std::printf("head: %.0f ns per request (%zu bytes, %u fields, llhttp %s)\n", best, req.size(),
              unsigned{head.header_count}, parser.llhttp_ran() ? "used" : "not used");
  return sink == 0 ? 1 : 0;
}
