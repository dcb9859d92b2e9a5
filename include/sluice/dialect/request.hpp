#pragma once
// dialect: a client's Responses or Messages request -> the canonical request
// (an OpenAI chat completions body), written once per request (cold path:
// the output string is the caller's, reused across requests). What cannot
// be carried is refused with a 400 naming the field; nothing is forwarded
// then. The chat body written here is read again by openai::request_reader
// like any client's, so routing, quota and the adapters see one shape.
#include <simdjson.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/openai/request.hpp"

namespace sluice::dialect {

// What the translation saw that the chat body does not say.
struct translated_request {
  bool stream = false;
  // Responses: `previous_response_id` was given (a store must hold it).
  std::string_view previous_response_id;
  bool store = true;  // Responses: `store` (false: the response is not kept)
};

// Shard-local, one per shard. `body` needs simdjson's padding readable
// after it (the codecs keep it). Returns: true with `out` replaced by the
// chat body (stream_options.include_usage on when streamed, so the usage
// the dialect's last events carry is there), or false with `err` filled.
// Views in `err` are static or point into the translator (until its next call).
class request_translator {
 public:
  request_translator() = default;
  request_translator(const request_translator&) = delete;
  request_translator& operator=(const request_translator&) = delete;

  // Anthropic Messages (POST /v1/messages, /v1/messages/count_tokens).
  // `count_only`: count_tokens, which has no max_tokens.
  bool messages(std::string_view body, bool count_only, std::string& out, translated_request& t,
                openai::request_error& err);
  // OpenAI Responses (POST /v1/responses). `history`: the stored
  // conversation it continues (previous_response_id), as comma-separated
  // item objects, read before `input`. `items` (when not null): replaced by
  // the conversation up to this request as such items (history, then
  // input), for the response store.
  bool responses(std::string_view body, std::string& out, translated_request& t, openai::request_error& err,
                 std::string_view history = {}, std::string* items = nullptr);

 private:
  simdjson::dom::parser _parser;
  simdjson::dom::parser _history_parser;
  std::string _history;
  char _param[96] = {};
};

}  // namespace sluice::dialect
