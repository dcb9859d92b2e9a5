// bench-render: what rendering a chat stream in the Responses and Messages
// dialects costs per event, apart from any I/O -- the renderer fed vLLM's
// events of a 180-token reply (the role chunk, one content chunk a token,
// the finish, [DONE]), as the relay feeds them, many times over.
//
//   build/bench-render [--iterations N]
//
// Prints ns per event and the bytes rendered per reply for each dialect.
// The proxy-level figure (CPU per request against chat pass-through) is
// bench/dialects'; this one isolates the renderer's share.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sluice/dialect/render.hpp"

using sluice::dialect::client_dialect;
using sluice::dialect::stream_renderer;

namespace {

std::vector<std::string> vllm_events(int tokens) {
  const std::string head = R"({"id":"chatcmpl-8f3a9c2b1d4e4f6a8b7c","object":"chat.completion.chunk","created":1700000000,"model":"mock-model","choices":[{"index":0,"delta":{)";
  std::vector<std::string> ev;
  ev.push_back(head + R"("role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})");
  for (int i = 0; i < tokens; ++i) {
    ev.push_back(head + R"("content":" tok)" + std::to_string(i) + R"("},"logprobs":null,"finish_reason":null}]})");
  }
  ev.push_back(head + R"("content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]})");
  ev.push_back("[DONE]");
  return ev;
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 20000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      iterations = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench-render [--iterations N]\n");
      return 2;
    }
  }
  if (iterations <= 0) iterations = 1;
  const std::vector<std::string> ev = vllm_events(180);
  const std::string request_id(64, 'r');  // sluice's request ids are up to 64 bytes
  std::vector<char> out(1 << 20);
  for (const client_dialect d : {client_dialect::responses, client_dialect::messages}) {
    stream_renderer r(16 * 1024);
    size_t bytes = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < iterations; ++it) {
      r.reset(d, {request_id, 1700000000, "mock-model"});
      size_t n = 0;
      r.start(out.data(), out.size(), n);
      bytes = n;
      for (const std::string& e : ev) {
        if (r.feed(e, out.data(), out.size(), n) != sluice::dialect::render_status::ok) {
          std::fprintf(stderr, "bench-render: an event did not render\n");
          return 1;
        }
        bytes += n;
      }
    }
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-9s %7.1f ns/event  %6zu bytes/reply  (%zu events, %d replies)\n",
                d == client_dialect::responses ? "responses" : "messages", ns / iterations / static_cast<double>(ev.size()),
                bytes, ev.size(), iterations);
  }
  return 0;
}
