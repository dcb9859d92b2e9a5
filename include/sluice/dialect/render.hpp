#pragma once
// dialect: the canonical events of a reply, rendered in the client's
// dialect. The events are read from the canonical reply -- the chat
// completions chunks (or body) every adapter's backend answer becomes --
// and written as Responses or Messages events (or body):
//
//   canonical event       Responses                         Messages
//   start                 response.created, .in_progress    message_start
//   text delta            output_item.added (message),      content_block_start (text),
//                         content_part.added, output_text.delta   content_block_delta text_delta
//   reasoning delta       output_item.added (reasoning),    content_block_start (thinking), thinking_delta
//                         reasoning_text.delta
//   tool-call start       output_item.added (function_call) content_block_start (tool_use)
//   tool-call args delta  function_call_arguments.delta     content_block_delta input_json_delta
//   finish, usage         the open item's .done events,     content_block_stop, message_delta
//                         response.completed / .incomplete  (stop_reason, usage), message_stop
//   error                 response.failed                   event: error
//
// One renderer per streamed exchange (reused across them with reset()).
// Its parser is allocated at construction for events up to event_bytes_max
// (a rare larger one gets its own, for that event only);
// a Responses stream keeps the current item's text (for its .done events
// and response.completed) in buffers that grow by doubling and stay, so a
// warm renderer does not allocate per event.
#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "sluice/dialect/dialect.hpp"

namespace sluice::openai::detail {
struct bounded_sink;  // the renderer's output (src/openai/json_writer.hpp)
}

namespace sluice::dialect {

struct reply_context {
  std::string_view request_id;  // ids are "resp_" / "msg_" + it
  int64_t created_s = 0;
  std::string_view model;       // the name the client asked for
};

// What billing and audit read from a rendered reply: the canonical usage.
struct reply_outcome {
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  int64_t cached_tokens = -1;     // prompt tokens served from the backend's cache
  int64_t reasoning_tokens = -1;  // completion tokens spent reasoning
  std::string_view finish_reason; // chat's ("stop", "length", "tool_calls"...), static
  bool error = false;
  uint32_t deltas = 0;            // text, reasoning and argument deltas rendered (a cut stream is billed by them)
};

enum class render_status : uint8_t {
  ok,         // `written` bytes (maybe 0)
  malformed,  // the event is not a chat chunk: the caller ends the stream (finish(true))
  too_large,  // the output did not fit in cap (call with cap >= bound())
  more_room,  // feed(): nothing read or written; call again with cap >= bound(data.size())
};

class stream_renderer {
 public:
  static constexpr uint32_t k_items_max = 64;  // output items (text, tool calls) per reply
  // An event past event_bytes_max (a whole tool call's arguments in one
  // delta, as some backends' tool parsers write them) is parsed by a parser
  // made for it and freed after. A backend's event is read whole up to
  // k_large_event_bytes_max; the renderer takes k_translation_slack_bytes
  // more, since a translator's chat chunk wraps an event of the backend's
  // own protocol (an Anthropic delta of up to 4 MiB) in a few hundred
  // bytes more. A longer one ends the stream as malformed.
  static constexpr size_t k_large_event_bytes_max = 4u << 20;
  static constexpr size_t k_translation_slack_bytes = 64u << 10;

  explicit stream_renderer(size_t event_bytes_max = 64 * 1024);
  stream_renderer(const stream_renderer&) = delete;
  stream_renderer& operator=(const stream_renderer&) = delete;

  // A new exchange; `ctx`'s views must outlive it. d: responses or messages.
  void reset(client_dialect d, const reply_context& ctx) noexcept;

  // The most feed() or finish() may write for an event of `data_bytes`.
  size_t bound(size_t data_bytes) const noexcept;

  // The stream's opening, before any chat event (the backend answered and
  // is still at its prefill): response.created and .in_progress, or
  // message_start and a ping, as Anthropic opens its own streams. Nothing
  // when already started.
  render_status start(char* out, size_t cap, size_t& written) noexcept;

  // One SSE event of the chat stream: its data (a chunk, an {"error"}
  // object, or [DONE]). Writes the dialect's events for it into out[0, cap).
  // A plain token's delta needs only its own few hundred bytes; anything
  // else asks for bound(data.size()) first (more_room, nothing consumed),
  // so a caller need not work the bound out per event.
  render_status feed(std::string_view data, char* out, size_t cap, size_t& written) noexcept;
  // vLLM's plain token event (one text delta of the open text block, in
  // vLLM's exact layout, checked whole): rendered as feed() renders it.
  // Returns: false, nothing read or written, for any other event or when
  // its delta does not fit (then feed() it). A plain event has no byte
  // below 0x20 -- no CR, no LF -- so a relay may take one from a chunk
  // that holds "data: " + it + "\n\n" without an SSE scan: the scan would
  // have found the same one event.
  bool feed_plain(std::string_view data, char* out, size_t cap, size_t& written) noexcept;
  // The chat stream ended (or failed: `failed`) without [DONE]: the closing
  // events (Messages: an error event when failed; Responses:
  // response.failed). Nothing when done() already.
  render_status finish(bool failed, char* out, size_t cap, size_t& written) noexcept;

  bool done() const noexcept { return _done; }
  // Responses, once done() without an error: the response object its
  // response.completed (or .incomplete) carried, into `out` (replaced), for
  // the response store. Returns: false when there is none. Cold path.
  bool write_response(std::string& out);
  const reply_outcome& outcome() const noexcept { return _out; }

 private:
  enum class open_kind : uint8_t { none, text, reasoning, tool };
  template <class W> void begin(W& w);
  template <class W> void open_block(W& w, open_kind k, std::string_view id, std::string_view name);
  template <class W> void close_block(W& w);
  template <class W> void delta(W& w, open_kind k, std::string_view text, bool escaped);
  // The plain content event's delta, written in three copies (the event up
  // to its text, the text, the tail) after one room check. Returns: false,
  // nothing written, when the room is short. `text` lies in `event`.
  bool plain_delta(openai::detail::bounded_sink& s, std::string_view event, std::string_view text);
  void make_delta_parts(open_kind k) noexcept;
  void step_delta_seq() noexcept;
  // vLLM's plain content event: its text, still escaped, without a parse.
  // The layout's head (id, created, model) is the same for every event of
  // a stream: once walked, it is kept, and the next events are matched
  // against it with one compare.
  bool plain_content(std::string_view data, std::string_view& content) noexcept;
  template <class W> void end(W& w, bool failed, std::string_view message);
  template <class W> void seq(W& w, std::string_view type);
  template <class W> void item_id(W& w);
  template <class W> void response_object(W& w, std::string_view status);

  client_dialect _d = client_dialect::messages;
  reply_context _ctx;
  size_t _event_bytes_max;
  std::unique_ptr<char[]> _padded;
  simdjson::dom::parser _parser;
  bool _started = false;
  bool _done = false;
  open_kind _open = open_kind::none;
  int64_t _tool = -1;             // the chat tool index of the open tool block
  uint32_t _blocks = 0;           // blocks / output items opened so far
  uint64_t _seq = 0;              // Responses: sequence_number
  reply_outcome _out;
  char _plain_head[320] = {};     // the last plain content event's bytes up to its text (plain_content)
  uint16_t _plain_head_len = 0;   // 0: none yet
  char _stop_sequence[64] = {};   // vLLM's stop_reason when a stop string ended it
  uint8_t _stop_sequence_len = 0;
  char _item_id[416] = {};        // Responses: the open item's id, escaped and quoted (a 64-byte request id, 6 bytes a byte at worst)
  uint16_t _item_id_len = 0;
  // The open block's delta event up to its text (make_delta_parts, at the
  // block's first delta): Messages' is fixed; Responses' holds the next
  // sequence number's digits at [_delta_seq_at, _delta_seq_end), stepped in
  // place after each delta (step_delta_seq), so one copy writes it.
  char _delta_pre[800] = {};
  uint16_t _delta_len = 0;        // 0: not made yet
  uint16_t _delta_seq_at = 0;
  uint16_t _delta_seq_end = 0;
  uint64_t _delta_seq = 0;        // the sequence number its digits spell
  // Responses: the open item's text (or arguments), kept JSON-escaped, its call id and name,
  // and the finished items as JSON for response.completed.
  std::string _text;
  std::string _call_id;
  std::string _name;
  std::string _items;
};

// A non-stream chat.completion body -> the dialect's body (a Responses
// response object or an Anthropic message) in `out` (replaced). Returns:
// false when `body` is not a chat.completion. Cold path.
bool render_reply(client_dialect d, std::string_view body, const reply_context& ctx, std::string& out,
                  reply_outcome& outcome);

// An OpenAI-shaped error body ({"error":{"message",...}}, as sluice writes
// it) -> its message, a view into `body`, unescaped into `scratch` when it
// holds escapes. Empty when there is none.
std::string_view error_message_of(std::string_view body, char* scratch, size_t cap) noexcept;

}  // namespace sluice::dialect
