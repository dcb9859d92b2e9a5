#pragma once
// h2 (private): what session.cpp and callbacks.cpp share -- a stream's
// state, and the nghttp2 callbacks' installation.
#include <nghttp2/nghttp2.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "sluice/h2/session.hpp"

namespace sluice::h2::detail {

inline constexpr uint8_t k_pieces_max = 8;

// An offset and length into a stream's header copy.
struct slot {
  uint32_t off = 0;
  uint32_t len = 0;
  bool set = false;
};

inline nghttp2_nv make_nv(std::string_view name, std::string_view value) noexcept {
  // nghttp2 copies names and values at submit (no NO_COPY flags) and never
  // writes through these pointers.
  return {reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
          reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(), value.size(),
          NGHTTP2_NV_FLAG_NONE};
}

// Sets every callback the server session uses (callbacks.cpp).
void set_callbacks(nghttp2_session_callbacks* cbs) noexcept;
// The data provider that reads a stream's queued body pieces.
nghttp2_data_provider body_provider(server_session::stream_state* st) noexcept;

}  // namespace sluice::h2::detail

namespace sluice::h2 {

using detail::k_pieces_max;
using detail::slot;

// Shard-local, one per stream that sent a request HEADERS: from its first
// header until nghttp2 closes it (or the connection ends). Allocated from
// the session's counting allocator.
struct server_session::stream_state {
  int32_t id = 0;
  stream_state* next = nullptr;          // server_session::_streams
  stream_state* prev = nullptr;
  stream_state* drained_next = nullptr;  // server_session::_drained
  bool in_drained = false;
  // The request head: pseudo-header values, and the regular fields as
  // "name:value\r\n" lines, in one buffer that grows while the head is
  // decoded and never moves after it is reported.
  char* buf = nullptr;
  uint32_t buf_len = 0;
  uint32_t buf_cap = 0;
  uint32_t fields_off = 0;  // where the field lines start (pseudo-headers come first)
  bool fields_started = false;
  uint32_t list_bytes = 0;  // RFC 9113 §6.5.2 size of the decoded list
  uint32_t trailer_bytes = 0;
  uint16_t field_count = 0;
  slot method, scheme, authority, path;
  slot host, authorization, api_key, content_type, content_length, session_id, request_id, expect;
  bool too_large = false;    // answered 431 by the session
  bool malformed = false;    // reset PROTOCOL_ERROR by the session
  bool head_reported = false;
  bool abandoned = false;    // the owner never hears of it again (431, malformed)
  bool client_reset = false;
  bool server_reset = false; // RST_STREAM sent, by the owner or the session
  bool response_submitted = false;
  bool body_open = false;    // send_body() may still add pieces
  bool end_queued = false;   // the last piece is queued
  bool deferred = false;     // the data provider said NGHTTP2_ERR_DEFERRED
  bool response_ended = false;
  bool request_ended = false;
  // Body pieces in the caller's buffers, oldest first. A chunked piece
  // (bit of its slot in chunked_slots) holds whole chunks of HTTP/1.1
  // framing: only their data goes out, read straight from the caller's
  // buffer.
  uint8_t piece_first = 0;
  uint8_t piece_count = 0;
  uint8_t chunked_slots = 0;
  size_t piece_off = 0;      // bytes of the first piece already read (framing included)
  size_t payload_off = 0;    // payload bytes of the first piece already copied
  size_t chunk_left = 0;     // chunked: data bytes left in the current chunk (0: at a size line)
  iovec pieces[k_pieces_max] = {};
  size_t payloads[k_pieces_max] = {};  // payload bytes per slot (iov_len unless chunked)

  std::string_view view(slot s) const noexcept { return {buf + s.off, s.len}; }
  bool owned() const noexcept { return head_reported && !abandoned; }
};

}  // namespace sluice::h2
