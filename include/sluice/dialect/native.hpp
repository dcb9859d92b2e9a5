#pragma once
// dialect: a Responses or Messages request passed through to a backend that
// speaks it natively (group.native_dialects), and what billing reads from
// the backend's own reply -- in place, nothing re-rendered:
//   Messages   message_start's usage.input_tokens (+ cache reads and writes),
//              message_delta's usage.output_tokens; a body's usage object
//   Responses  response.completed / .incomplete / .failed's response.usage;
//              a body's usage object
#include <cstdint>
#include <string_view>

#include "sluice/dialect/dialect.hpp"

namespace sluice::dialect {

enum class member_scan : uint8_t {
  found,      // [begin, end): the member's value token (a string: quotes included)
  absent,
  duplicate,  // a top-level member name given twice: the backend and sluice could read it two ways
  escaped,    // a top-level member name with an escape: compared raw, it could hide a duplicate
  malformed,
};

// One pass over the top level of a JSON object body (already checked to be
// valid JSON): the span of member `key`'s value, and any top-level member
// name given twice or written with an escape. Bounded: 256 names at most
// are compared.
member_scan top_level_member(std::string_view body, std::string_view key, uint32_t& begin, uint32_t& end) noexcept;

struct native_usage {
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  uint32_t content_events = 0;  // deltas seen (a stream cut short is billed by them)
  bool error = false;           // an error event / response.failed
  bool content = false;         // this event carried generated output
};

// One SSE event's data of a native stream. Events that carry no usage are
// told apart without a parse (by a "type" that stands first or last); the
// others are parsed (a thread-local parser and padded copy: no allocation
// once warm). `response_id`: set to a Responses stream's id where this
// event is its response.created (a view valid until the next call on this
// thread).
void scan_native_event(client_dialect d, std::string_view data, native_usage& u,
                       std::string_view* response_id = nullptr) noexcept;

// A non-stream native reply's usage: the last "usage" object in `body` (its
// whole or its tail), parsed alone.
native_usage native_body_usage(client_dialect d, std::string_view body) noexcept;

}  // namespace sluice::dialect
