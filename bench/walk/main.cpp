// bench-walk: what the relay's walk over a backend's chunked event stream
// costs per response, apart from any I/O -- the response parser fed
// bench/harness2's SSE reply (222 events in vLLM's layout, each in its own
// HTTP chunk, the usage chunk, [DONE]: ~52 KB) whole, as one receive hands
// it over, with the relay's skip of plain one-event chunks on (its head and
// tail: the finish, usage and [DONE] chunks are handed on).
//
//   build/bench-walk [--iterations N] [--buffers B]
//
// Each response is first copied into one of B 64 KiB buffers in turn (as
// the kernel's copy fills a receive buffer of the ring before the walk
// reads it); that copy alone is timed too and taken off. Prints ns per
// response and per chunk, the best of 5 rounds. The proxy-level figure is
// bench/harness2's; this one isolates the walk's share.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sluice/http/response.hpp"

namespace {

using namespace sluice::http;

struct counts {
  bool skip_ok = true;
  uint64_t skipped = 0, chunks = 0;
};

std::string harness2_reply(int events) {
  std::string r =
      "HTTP/1.1 200 OK\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
      "content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n";
  const auto chunk = [&r](const std::string& payload) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", payload.size());
    r += size;
    r += payload;
    r += "\r\n";
  };
  const std::string base =
      R"({"id":"chatcmpl-h2b0c4e1d2a3f4b5c6d7e8f9a0b1c2d3e4","object":"chat.completion.chunk","created":1767225600,"model":"mock-model","choices":[{"index":0,)";
  chunk("data: " + base + R"("delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})" + "\n\n");
  for (int i = 0; i < events - 2; ++i) {
    chunk("data: " + base + R"("delta":{"content":" word)" + std::to_string(i) +
          R"("},"logprobs":null,"finish_reason":null}]})" + "\n\n");
  }
  chunk("data: " + base + R"("delta":{"content":""},"logprobs":null,"finish_reason":"length","stop_reason":null}]})" + "\n\n");
  chunk(R"(data: {"id":"chatcmpl-h2b0c4e1d2a3f4b5c6d7e8f9a0b1c2d3e4","object":"chat.completion.chunk","created":1767225600,"model":"mock-model","choices":[],"usage":{"prompt_tokens":41,"total_tokens":261,"completion_tokens":220}})" "\n\n");
  chunk("data: [DONE]\n\n");
  r += "0\r\n\r\n";
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 20000, buffers = 64;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      iterations = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--buffers") == 0 && i + 1 < argc) {
      buffers = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench-walk [--iterations N] [--buffers B]\n");
      return 2;
    }
  }
  if (iterations <= 0) iterations = 1;
  if (buffers <= 0) buffers = 1;
  constexpr size_t k_buffer = 64 * 1024;
  const std::string reply = harness2_reply(222);
  if (reply.size() > k_buffer) return 1;
  std::vector<char> ring(static_cast<size_t>(buffers) * k_buffer);

  counts c;
  body_sink sink{[](void*, const char*, size_t) {}, &c, [](void* x, const char*) { ++static_cast<counts*>(x)->chunks; },
                 [](void* x, const char*, size_t, const char*) { ++static_cast<counts*>(x)->chunks; }};
  sink.skip_ok = &c.skip_ok;
  sink.skip_head = "data: {";
  sink.skip_tail = "\"finish_reason\":null}]}\n\n";  // the chat relay's (openai_http::k_plain_chunk_tail)
  sink.on_skipped = [](void* x, uint32_t n, const char*) { static_cast<counts*>(x)->skipped += n; };
  response_parser parser;
  response_head head;

  const auto round = [&](bool walk) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) {
      char* buf = ring.data() + static_cast<size_t>(i % buffers) * k_buffer;
      std::memcpy(buf, reply.data(), reply.size());
      if (!walk) continue;
      parser.reset();
      if (!parser.parse_head(buf, reply.size(), head).ok()) std::abort();
      const body_status bs = parser.feed_body(buf + head.head_bytes, reply.size() - head.head_bytes, sink);
      if (!bs.complete) std::abort();
    }
    const auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / iterations;
  };
  double best_walk = 1e300, best_copy = 1e300;
  for (int r = 0; r < 5; ++r) {
    const double w = round(true), cp = round(false);
    if (w < best_walk) best_walk = w;
    if (cp < best_copy) best_copy = cp;
  }
  const double chunks_per = static_cast<double>(c.skipped + c.chunks) / (5.0 * iterations);
  std::printf("walk: %.0f ns per response (%zu bytes, %.0f chunks: %.0f skipped), %.1f ns per chunk; the copy before it: %.0f ns\n",
              best_walk - best_copy, reply.size(), chunks_per, static_cast<double>(c.skipped) / (5.0 * iterations),
              (best_walk - best_copy) / chunks_per, best_copy);
  return 0;
}
