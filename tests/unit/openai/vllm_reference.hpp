#pragma once
// The reference bytes the translator tests compare with: what mock-vllm
// (tools/mock-vllm/wire.cpp) writes for vLLM, without its HTTP chunk
// framing. Test-only.
#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "../../../tools/mock-vllm/wire.hpp"

namespace sluice::test {

// A chunked body's payload.
inline std::string dechunk(std::string_view s) {
  std::string out;
  while (!s.empty()) {
    const size_t crlf = s.find("\r\n");
    REQUIRE(crlf != std::string_view::npos);
    const size_t n = std::stoul(std::string(s.substr(0, crlf)), nullptr, 16);
    if (n == 0) break;
    out += s.substr(crlf + 2, n);
    s.remove_prefix(crlf + 2 + n + 2);
  }
  return out;
}

// vLLM's SSE events for mock-vllm's reply of `tokens` tokens ("tok0 tok1
// ..."): the role chunk (chat), a chunk per token, then the finish -- on the
// last token when `ends_by_length`, else an empty stop chunk (a stop by
// EOS) --, the usage chunk when `usage` is given, [DONE].
inline std::string vllm_stream(mock_vllm::endpoint kind, std::string_view id, std::string_view model,
                               uint32_t tokens, bool ends_by_length,
                               std::optional<mock_vllm::usage_counts> usage) {
  std::string prefix;
  mock_vllm::append_chunk_prefix(prefix, kind, id, 1700000000, model);
  std::string framed;
  std::string scratch;
  if (kind == mock_vllm::endpoint::chat) mock_vllm::append_role_event(framed, scratch, prefix);
  for (uint32_t i = 0; i < tokens; ++i) {
    mock_vllm::append_token_event(framed, scratch, kind, prefix, i, ends_by_length && i + 1 == tokens);
  }
  if (!ends_by_length) mock_vllm::append_stop_event(framed, scratch, kind, prefix);
  if (usage) mock_vllm::append_usage_event(framed, scratch, prefix, *usage);
  mock_vllm::append_done_events(framed);
  return dechunk(framed);
}

}  // namespace sluice::test
