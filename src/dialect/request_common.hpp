#pragma once
// dialect (private): what both request translators share -- the writer, the
// lookups, and the 400 with a param naming an index ("messages[3].content[1]").
#include <simdjson.h>

#include <cstdarg>
#include <cstdio>
#include <string>
#include <string_view>

#include "../openai/json_writer.hpp"
#include "chat_read.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/openai/request.hpp"

// GCC 12 at -O3 inlines simdjson's array iteration into the walks below and
// then warns of a null tape it cannot rule out (an element is never made
// without its document here): a false positive for these two translators.
#pragma GCC diagnostic ignored "-Wnull-dereference"

namespace sluice::dialect::detail {

using simdjson::dom::element;
using writer = openai::detail::json_writer<openai::detail::string_sink>;


// A member that is present and not JSON null.
inline bool member(element obj, std::string_view key, element& out) noexcept {
  return obj[key].get(out) == simdjson::SUCCESS && !out.is_null();
}

// An element known to be an array (callers check is_array() first).
inline simdjson::dom::array as_array(element e) noexcept {
  SLUICE_ASSERT(e.is_array());
  return e.get_array().value_unsafe();
}

// The body (simdjson's padding readable after it) as a JSON object in `root`.
bool parse_object(simdjson::dom::parser& parser, std::string_view body, element& root) noexcept;

// The element as minified JSON, straight into the writer (a tool's
// arguments object becomes its string; a schema is copied as it is).
inline void raw_json(writer& w, element e) { w.raw(simdjson::minify(e)); }
inline void json_as_string(writer& w, element e) { w.str(simdjson::minify(e)); }

// One translation: the writer, the error, and the param buffer.
struct job {
  writer& w;
  openai::request_error& err;
  char* param;
  size_t param_cap;

  [[gnu::format(printf, 2, 3)]] const char* at(const char* format, ...) noexcept {
    va_list args;
    va_start(args, format);
    std::vsnprintf(param, param_cap, format, args);
    va_end(args);
    return param;
  }
  bool fail(std::string_view p, std::string_view message) noexcept {
    err = {message, p, {}};
    return false;
  }
};

// A chat tool's opening up to its parameters: {"type":"function",
// "function":{"name":N[,"description":D] (comma-led but for the first).
inline void function_tool_head(job& j, bool first, std::string_view name, std::string_view description) {
  j.w.raw(first ? "{\"type\":\"function\",\"function\":{\"name\":" : ",{\"type\":\"function\",\"function\":{\"name\":");
  j.w.str(name);
  if (!description.empty()) {
    j.w.raw(",\"description\":");
    j.w.str(description);
  }
}

// Sampling members carried as they are when they are numbers (the backend
// checks their range); another type is a 400.
inline bool copy_number(job& j, element root, std::string_view key, std::string_view as) {
  element v;
  if (!member(root, key, v)) return true;
  if (!v.is_number()) return j.fail(key, "must be a number");
  j.w.raw(",\"");
  j.w.raw(as);
  j.w.raw("\":");
  raw_json(j.w, v);
  return true;
}

}  // namespace sluice::dialect::detail
