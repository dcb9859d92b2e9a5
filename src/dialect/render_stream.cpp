// dialect: a chat completions stream, event by event, rendered as the
// client's Responses or Messages stream (render.hpp has the table).
#include <cctype>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "../openai/json_writer.hpp"
#include "chat_read.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/dialect/render.hpp"

namespace sluice::dialect {

namespace {

using simdjson::dom::element;
using bw = openai::detail::json_writer<openai::detail::bounded_sink>;
using sw = openai::detail::json_writer<openai::detail::string_sink>;

using detail::anthropic_stop;
using detail::get_int;
using detail::get_string;
using detail::static_finish;

void event_head(bw& w, std::string_view type) {
  w.raw("event: ");
  w.raw(type);
  w.raw("\ndata: {\"type\":\"");
  w.raw(type);
  w.raw("\"");
}

// vLLM's plain content event, one per token:
//   {"id":..,"object":"chat.completion.chunk",..,"choices":[{"index":0,
//    "delta":{"content":"TEXT"},"logprobs":null,"finish_reason":null}]}
// -- nothing but the first answer's text. Its TEXT is passed on as written
// (still escaped) once checked to be a whole JSON string body, without a
// parse; any other event (another layout, a usage or finish, an error) is
// parsed whole.
constexpr std::string_view k_plain_head = "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"";
constexpr std::string_view k_plain_tail = "\"},\"logprobs\":null,\"finish_reason\":null}]}";

#if defined(__SSE2__)
__m128i load16(const char* p) noexcept { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// A 16-byte piece's bytes that a JSON string must escape or that are not
// ASCII, as a bit mask: a signed compare below 0x20 takes both the control
// bytes and those of 0x80 and above.
unsigned not_plain16(const char* p) noexcept {
  const __m128i v = load16(p);
  const __m128i bad = _mm_or_si128(_mm_cmplt_epi8(v, _mm_set1_epi8(0x20)),
                                   _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                                                _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))));
  return static_cast<unsigned>(_mm_movemask_epi8(bad));
}
#endif

// a[0, n) == b[0, n), n >= 16, inline: the head kept from an earlier event
// and the plain event's tail, compared once per token.
bool same_bytes(const char* a, const char* b, size_t n) noexcept {
#if defined(__SSE2__)
  __m128i diff = _mm_setzero_si128();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) diff = _mm_or_si128(diff, _mm_xor_si128(load16(a + i), load16(b + i)));
  if (i != n) diff = _mm_or_si128(diff, _mm_xor_si128(load16(a + n - 16), load16(b + n - 16)));
  return _mm_movemask_epi8(_mm_cmpeq_epi8(diff, _mm_setzero_si128())) == 0xFFFF;
#else
  return std::memcmp(a, b, n) == 0;
#endif
}

// `readable`: the bytes that may be read from t.data() (the event's rest,
// which in a plain event is at least its tail past the text).
bool json_string_body(std::string_view t, size_t readable) noexcept {
  // Nearly every token's text is printable ASCII with nothing escaped: one
  // branch-free pass says so; anything else is checked byte by byte.
#if defined(__SSE2__)
  if (readable >= 16) {
    unsigned bad = 0;
    if (t.size() <= 16) {
      bad = not_plain16(t.data()) & ((1u << t.size()) - 1);
    } else {
      size_t i = 0;
      for (; i + 16 <= t.size(); i += 16) bad |= not_plain16(t.data() + i);
      if (i != t.size()) bad |= not_plain16(t.data() + t.size() - 16);
    }
    if (bad == 0) return true;
  }
#else
  (void)readable;
#endif
  bool plain = true;
  for (const char ch : t) {
    const auto c = static_cast<unsigned char>(ch);
    plain &= (c >= 0x20) & (c < 0x80) & (c != '"') & (c != '\\');
  }
  if (plain) return true;
  for (size_t i = 0; i < t.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    if (c == '"' || c < 0x20) return false;
    if (c != '\\') continue;
    if (++i == t.size()) return false;
    switch (t[i]) {
      case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't': break;
      case 'u':
        if (t.size() - i < 5) return false;
        for (size_t k = 1; k <= 4; ++k) {
          if (!std::isxdigit(static_cast<unsigned char>(t[i + k]))) return false;
        }
        i += 4;
        break;
      default: return false;
    }
  }
  // A token's text is short and nearly always ASCII: checked inline; the
  // rest by simdjson's validator.
  bool ascii = true;
  for (const char c : t) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  return ascii || simdjson::validate_utf8(t.data(), t.size());
}

}  // namespace

bool stream_renderer::plain_content(std::string_view data, std::string_view& content) noexcept {
  // vLLM's exact layout, walked once (an id and a model name with no escape
  // in them); anything else is parsed.
  if (data.size() < k_plain_head.size() + k_plain_tail.size() ||
      !same_bytes(data.data() + data.size() - k_plain_tail.size(), k_plain_tail.data(), k_plain_tail.size())) {
    return false;
  }
  const size_t kept = _plain_head_len;  // at least k_plain_head's 43 bytes
  if (kept != 0 && data.size() > kept + k_plain_tail.size() && same_bytes(data.data(), _plain_head, kept)) {
    // The head an earlier event's walk checked, byte for byte.
    content = data.substr(kept, data.size() - kept - k_plain_tail.size());
    return json_string_body(content, content.size() + k_plain_tail.size());
  }
  size_t at = 0;
  const auto literal = [&](std::string_view l) {
    if (data.substr(at, l.size()) != l) return false;
    at += l.size();
    return true;
  };
  const auto plain_string = [&] {  // up to and past its closing quote
    const void* q = std::memchr(data.data() + at, '"', data.size() - at);
    if (q == nullptr) return false;
    const size_t end = static_cast<size_t>(static_cast<const char*>(q) - data.data());
    if (std::memchr(data.data() + at, '\\', end - at) != nullptr) return false;
    for (size_t i = at; i < end; ++i) {  // nor a control byte (JSON has none raw; no CR or LF, see feed_plain)
      if (static_cast<unsigned char>(data[i]) < 0x20) return false;
    }
    at = end + 1;
    return true;
  };
  if (!literal("{\"id\":\"") || !plain_string() || !literal(",\"object\":\"chat.completion.chunk\",\"created\":")) return false;
  while (at < data.size() && data[at] >= '0' && data[at] <= '9') ++at;
  if (!literal(",\"model\":\"") || !plain_string() || !literal(",") || !literal(k_plain_head)) return false;
  const size_t to = data.size() - k_plain_tail.size();
  if (to <= at) return false;
  content = data.substr(at, to - at);
  if (!json_string_body(content, content.size() + k_plain_tail.size())) return false;
  if (at <= sizeof _plain_head) {
    std::memcpy(_plain_head, data.data(), at);
    _plain_head_len = static_cast<uint16_t>(at);
  }
  return true;
}

stream_renderer::stream_renderer(size_t event_bytes_max)
    : _event_bytes_max(event_bytes_max),
      _padded(new char[event_bytes_max + simdjson::SIMDJSON_PADDING]),
      _parser(event_bytes_max) {
  SLUICE_VERIFY(_parser.allocate(event_bytes_max) == simdjson::SUCCESS);
  _text.reserve(4096);
  _items.reserve(4096);
}

void stream_renderer::reset(client_dialect d, const reply_context& ctx) noexcept {
  _d = d;
  _ctx = ctx;
  _started = _done = false;
  _open = open_kind::none;
  _tool = -1;
  _blocks = 0;
  _seq = 0;
  _out = {};
  _stop_sequence_len = 0;
  _plain_head_len = 0;
  _delta_len = 0;
  _text.clear();
  _call_id.clear();
  _name.clear();
  _items.clear();
}

size_t stream_renderer::bound(size_t data_bytes) const noexcept {
  // Each byte of the event is written at most four times (a delta or a
  // tool's id and name, and again when its item closes), 6 bytes escaped;
  // each item it opens (one per tool call, 8 bytes of JSON at least, k_items_max
  // in all) costs its events' fixed text and ids; the item open before it
  // closes with its whole text four times, and response.completed writes
  // every item again.
  const size_t ids = 6 * (_ctx.request_id.size() + _ctx.model.size());
  const size_t left = _blocks < k_items_max ? k_items_max - _blocks : 0;
  const size_t opens = data_bytes / 8 + 2 < left + 1 ? data_bytes / 8 + 2 : left + 1;
  return 4096 + 8 * ids + 24 * data_bytes + opens * (1024 + 8 * ids) +
         24 * (_text.size() + _call_id.size() + _name.size()) + 6 * _items.size();
}

template <class W>
void stream_renderer::seq(W& w, std::string_view type) {
  event_head(w, type);
  w.raw(",\"sequence_number\":");
  w.num(static_cast<int64_t>(_seq++));
}

template <class W>
void stream_renderer::item_id(W& w) {
  w.raw(std::string_view(_item_id, _item_id_len));  // written at the item's open
}

template <class W>
void stream_renderer::response_object(W& w, std::string_view status) {
  w.raw("{\"id\":\"resp_");
  w.escaped(_ctx.request_id);
  w.raw("\",\"object\":\"response\",\"created_at\":");
  w.num(_ctx.created_s);
  w.raw(",\"status\":\"");
  w.raw(status);
  w.raw("\",\"error\":null,\"incomplete_details\":");
  w.raw(status == "incomplete" ? "{\"reason\":\"max_output_tokens\"}" : "null");
  w.raw(",\"model\":");
  w.str(_ctx.model);
  w.raw(",\"output\":[");
  if (status != "in_progress") w.raw(_items);
  w.raw("],\"parallel_tool_calls\":true,\"tool_choice\":\"auto\",\"tools\":[],\"usage\":");
  if (status == "in_progress") {
    w.raw("null}");
    return;
  }
  detail::write_responses_usage(w, _out);
  w.raw("}");
}

template <class W>
void stream_renderer::begin(W& w) {
  _started = true;
  if (_d == client_dialect::messages) {
    event_head(w, "message_start");
    w.raw(",\"message\":{\"id\":\"msg_");
    w.escaped(_ctx.request_id);
    w.raw("\",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    w.str(_ctx.model);
    w.raw(",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,"
          "\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}}\n\n");
    return;
  }
  seq(w, "response.created");
  w.raw(",\"response\":");
  response_object(w, "in_progress");
  w.raw("}\n\n");
  seq(w, "response.in_progress");
  w.raw(",\"response\":");
  response_object(w, "in_progress");
  w.raw("}\n\n");
}

template <class W>
void stream_renderer::open_block(W& w, open_kind k, std::string_view id, std::string_view name) {
  close_block(w);
  _open = k;
  ++_blocks;
  _delta_len = 0;  // this block's delta parts are made at its first delta
  if (_d == client_dialect::messages) {
    event_head(w, "content_block_start");
    w.raw(",\"index\":");
    w.num(static_cast<int64_t>(_blocks - 1));
    if (k == open_kind::text) {
      w.raw(",\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
    } else if (k == open_kind::reasoning) {
      w.raw(",\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n");
    } else {
      w.raw(",\"content_block\":{\"type\":\"tool_use\",\"id\":");
      w.str(id);
      w.raw(",\"name\":");
      w.str(name);
      w.raw(",\"input\":{}}}\n\n");
    }
    return;
  }
  _text.clear();
  {  // the item's id, escaped once: "msg_<request id>_<n>" or "fc_..."
    openai::detail::bounded_sink ids{_item_id, sizeof _item_id};
    bw iw(ids);
    iw.raw(k == open_kind::tool ? "\"fc_" : k == open_kind::reasoning ? "\"rs_" : "\"msg_");
    iw.escaped(_ctx.request_id.substr(0, 64));
    iw.raw("_");
    iw.num(static_cast<int64_t>(_blocks - 1));
    iw.raw("\"");
    _item_id_len = static_cast<uint16_t>(ids.fits() ? ids.size : 0);
  }
  seq(w, "response.output_item.added");
  w.raw(",\"output_index\":");
  w.num(static_cast<int64_t>(_blocks - 1));
  w.raw(",\"item\":{\"id\":");
  item_id(w);
  if (k != open_kind::tool) {
    w.raw(k == open_kind::text
              ? ",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n"
              : ",\"type\":\"reasoning\",\"summary\":[],\"content\":[]}}\n\n");
    seq(w, "response.content_part.added");
    w.raw(",\"item_id\":");
    item_id(w);
    w.raw(",\"output_index\":");
    w.num(static_cast<int64_t>(_blocks - 1));
    w.raw(k == open_kind::text
              ? ",\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}\n\n"
              : ",\"content_index\":0,\"part\":{\"type\":\"reasoning_text\",\"text\":\"\"}}\n\n");
    return;
  }
  _call_id.assign(id);
  _name.assign(name);
  w.raw(",\"type\":\"function_call\",\"status\":\"in_progress\",\"call_id\":");
  w.str(id);
  w.raw(",\"name\":");
  w.str(name);
  w.raw(",\"arguments\":\"\"}}\n\n");
}

template <class W>
void stream_renderer::delta(W& w, open_kind k, std::string_view text, bool escaped) {
  // `escaped`: the text is a JSON string's content as the backend wrote it
  // (checked: whole escapes, no raw quote or control byte, valid UTF-8).
  ++_out.deltas;
  if (_delta_len == 0 || (_d == client_dialect::responses && _delta_seq != _seq)) make_delta_parts(k);
  if (_d == client_dialect::responses) {
    if (escaped) {  // _text keeps the item's text escaped, as it is written
      _text.append(text);
    } else {
      openai::detail::string_sink acc{_text};
      sw(acc).escaped(text);
    }
  }
  w.raw(std::string_view(_delta_pre, _delta_len));
  if (_d == client_dialect::responses) {
    ++_seq;
    step_delta_seq();
  }
  if (escaped) {
    w.raw(text);
  } else {
    w.escaped(text);
  }
  w.raw(_d == client_dialect::messages ? std::string_view("\"}}\n\n")
        : k == open_kind::text         ? std::string_view("\",\"logprobs\":[]}\n\n")
                                       : std::string_view("\"}\n\n"));
}

bool stream_renderer::plain_delta(openai::detail::bounded_sink& s, std::string_view event, std::string_view text) {
  if (_delta_len == 0 || (_d == client_dialect::responses && _delta_seq != _seq)) make_delta_parts(open_kind::text);
  constexpr std::string_view messages_tail = "\"}}\n\n", responses_tail = "\",\"logprobs\":[]}\n\n";
  // A token's text is a few bytes: copied as 16 when the event has them
  // (its tail follows the text), the bytes past the text overwritten by
  // the tail or left past the written size.
  const size_t tail = _d == client_dialect::responses ? responses_tail.size() : messages_tail.size();
  if (s.size > s.cap || s.cap - s.size < _delta_len + text.size() + tail) return false;
  const bool short_text = text.size() <= 16 && event.data() + event.size() - text.data() >= 16 &&
                          s.cap - s.size >= _delta_len + 16u;
  if (_d == client_dialect::responses) _text.append(text);  // the item's text, escaped as written
  char* o = s.out + s.size;
  openai::detail::copy_bytes(o, _delta_pre, _delta_len);
  o += _delta_len;
  if (short_text) {
    std::memcpy(o, text.data(), 16);
  } else if (!text.empty()) {
    openai::detail::copy_bytes(o, text.data(), text.size());
  }
  o += text.size();
  if (_d == client_dialect::responses) {
    std::memcpy(o, responses_tail.data(), responses_tail.size());
    o += responses_tail.size();
    ++_seq;
    step_delta_seq();
  } else {
    std::memcpy(o, messages_tail.data(), messages_tail.size());
    o += messages_tail.size();
  }
  s.size = static_cast<size_t>(o - s.out);
  ++_out.deltas;
  return true;
}

void stream_renderer::step_delta_seq() noexcept {
  // The digits spell _delta_seq; now the next: a decimal increment in
  // place, or, past 9...9, made again (one digit more) at the next delta.
  ++_delta_seq;
  char* d = _delta_pre + _delta_seq_end;
  while (d != _delta_pre + _delta_seq_at) {
    --d;
    if (*d != '9') {
      ++*d;
      return;
    }
    *d = '0';
  }
  _delta_len = 0;
}

void stream_renderer::make_delta_parts(open_kind k) noexcept {
  // A delta event's fixed text, written at the block's first delta:
  // Messages' whole head up to the text; Responses' head, the next
  // sequence number, then the item's id and index up to the delta's text.
  openai::detail::bounded_sink ps{_delta_pre, sizeof _delta_pre};
  bw p(ps);
  if (_d == client_dialect::messages) {
    p.raw("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":");
    p.num(static_cast<int64_t>(_blocks - 1));
    p.raw(k == open_kind::text        ? ",\"delta\":{\"type\":\"text_delta\",\"text\":\""
          : k == open_kind::reasoning ? ",\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\""
                                      : ",\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"");
    _delta_seq_at = _delta_seq_end = 0;
  } else {
    const std::string_view type = k == open_kind::text        ? "response.output_text.delta"
                                  : k == open_kind::reasoning ? "response.reasoning_text.delta"
                                                              : "response.function_call_arguments.delta";
    event_head(p, type);
    p.raw(",\"sequence_number\":");
    _delta_seq_at = static_cast<uint16_t>(ps.size);
    p.num(static_cast<int64_t>(_seq));
    _delta_seq_end = static_cast<uint16_t>(ps.size);
    _delta_seq = _seq;
    p.raw(",\"item_id\":");
    item_id(p);
    p.raw(",\"output_index\":");
    p.num(static_cast<int64_t>(_blocks - 1));
    p.raw(k != open_kind::tool ? ",\"content_index\":0,\"delta\":\"" : ",\"delta\":\"");
  }
  // It fits (ids are cut to 64 bytes): a bug otherwise.
  SLUICE_VERIFY(ps.fits());
  _delta_len = static_cast<uint16_t>(ps.size);
}

template <class W>
void stream_renderer::close_block(W& w) {
  if (_open == open_kind::none) return;
  const open_kind k = _open;
  if (_d == client_dialect::messages) {
    event_head(w, "content_block_stop");
    w.raw(",\"index\":");
    w.num(static_cast<int64_t>(_blocks - 1));
    w.raw("}\n\n");
    _open = open_kind::none;
    return;
  }
  // The item as response.completed lists it.
  openai::detail::string_sink items{_items};
  sw iw(items);
  if (!_items.empty()) iw.raw(",");
  const size_t item_start = _items.size();
  const int64_t index = static_cast<int64_t>(_blocks - 1);
  if (k == open_kind::reasoning) {
    seq(w, "response.reasoning_text.done");
    w.raw(",\"item_id\":");
    item_id(w);
    w.raw(",\"output_index\":");
    w.num(index);
    w.raw(",\"content_index\":0,\"text\":\"");
    w.raw(_text);
    w.raw("\"}\n\n");
    seq(w, "response.content_part.done");
    w.raw(",\"item_id\":");
    item_id(w);
    w.raw(",\"output_index\":");
    w.num(index);
    w.raw(",\"content_index\":0,\"part\":{\"type\":\"reasoning_text\",\"text\":\"");
    w.raw(_text);
    w.raw("\"}}\n\n");
    iw.raw("{\"id\":");
    item_id(iw);
    iw.raw(",\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"");
    iw.raw(_text);
    iw.raw("\"}]}");
  } else if (k == open_kind::text) {
    seq(w, "response.output_text.done");
    w.raw(",\"item_id\":");
    item_id(w);
    w.raw(",\"output_index\":");
    w.num(index);
    w.raw(",\"content_index\":0,\"text\":");
    w.raw("\"");
    w.raw(_text);
    w.raw("\"");
    w.raw(",\"logprobs\":[]}\n\n");
    seq(w, "response.content_part.done");
    w.raw(",\"item_id\":");
    item_id(w);
    w.raw(",\"output_index\":");
    w.num(index);
    w.raw(",\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":");
    w.raw("\"");
    w.raw(_text);
    w.raw("\"");
    w.raw(",\"annotations\":[]}}\n\n");
    iw.raw("{\"id\":");
    item_id(iw);
    iw.raw(",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":"
           "\"output_text\",\"text\":");
    iw.raw("\"");
    iw.raw(_text);
    iw.raw("\"");
    iw.raw(",\"annotations\":[]}]}");
  } else {
    seq(w, "response.function_call_arguments.done");
    w.raw(",\"item_id\":");
    item_id(w);
    w.raw(",\"output_index\":");
    w.num(index);
    w.raw(",\"arguments\":");
    w.raw("\"");
    w.raw(_text);
    w.raw("\"");
    w.raw("}\n\n");
    iw.raw("{\"id\":");
    item_id(iw);
    iw.raw(",\"type\":\"function_call\",\"status\":\"completed\",\"call_id\":");
    iw.str(_call_id);
    iw.raw(",\"name\":");
    iw.str(_name);
    iw.raw(",\"arguments\":");
    iw.raw("\"");
    iw.raw(_text);
    iw.raw("\"");
    iw.raw("}");
  }
  seq(w, "response.output_item.done");
  w.raw(",\"output_index\":");
  w.num(index);
  w.raw(",\"item\":");
  w.raw(std::string_view(_items).substr(item_start));  // the item just written there
  w.raw("}\n\n");
  _open = open_kind::none;
}

template <class W>
void stream_renderer::end(W& w, bool failed, std::string_view message) {
  if (_done) return;
  if (!_started) begin(w);
  _done = true;
  if (failed) {
    _out.error = true;
    if (_out.finish_reason.empty()) _out.finish_reason = "error";
  }
  if (_d == client_dialect::messages) {
    if (failed) {
      // A failure mid-stream: Anthropic's error event ends it.
      w.raw("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":");
      w.str(message);
      w.raw("}}\n\n");
      return;
    }
    close_block(w);
    event_head(w, "message_delta");
    w.raw(",\"delta\":{\"stop_reason\":\"");
    w.raw(anthropic_stop(_out.finish_reason, _stop_sequence_len != 0));
    w.raw("\",\"stop_sequence\":");
    if (_stop_sequence_len != 0) {
      w.str(std::string_view(_stop_sequence, _stop_sequence_len));
    } else {
      w.raw("null");
    }
    w.raw("},\"usage\":");
    detail::write_messages_usage(w, _out);
    w.raw("}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    return;
  }
  if (failed) {
    seq(w, "response.failed");
    w.raw(",\"response\":{\"id\":\"resp_");
    w.escaped(_ctx.request_id);
    w.raw("\",\"object\":\"response\",\"created_at\":");
    w.num(_ctx.created_s);
    w.raw(",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":");
    w.str(message);
    w.raw("},\"incomplete_details\":null,\"model\":");
    w.str(_ctx.model);
    w.raw(",\"output\":[],\"usage\":null}}\n\n");
    return;
  }
  close_block(w);
  const bool incomplete = _out.finish_reason == "length";
  seq(w, incomplete ? "response.incomplete" : "response.completed");
  w.raw(",\"response\":");
  response_object(w, incomplete ? "incomplete" : "completed");
  w.raw("}\n\n");
}

bool stream_renderer::write_response(std::string& out) {
  if (_d != client_dialect::responses || !_done || _out.error) return false;
  out.clear();
  openai::detail::string_sink sink{out};
  sw w(sink);
  response_object(w, _out.finish_reason == "length" ? "incomplete" : "completed");
  return true;
}

bool stream_renderer::feed_plain(std::string_view data, char* out, size_t cap, size_t& written) noexcept {
  written = 0;
  std::string_view content;
  if (_done || !_started || _open != open_kind::text || !plain_content(data, content)) return false;
  if (content.empty()) return true;  // as a parsed event's empty text: nothing
  openai::detail::bounded_sink sink{out, cap};
  try {
    if (!plain_delta(sink, data, content)) return false;
  } catch (...) {  // the item's text could not grow: feed() says so
    return false;
  }
  written = sink.size;
  return true;
}

render_status stream_renderer::feed(std::string_view data, char* out, size_t cap, size_t& written) noexcept {
  written = 0;
  if (_done) return render_status::ok;
  openai::detail::bounded_sink sink{out, cap};
  bw w(sink);
  try {
    if (data == "[DONE]") {
      if (cap < bound(0)) return render_status::more_room;
      end(w, false, {});
    } else {
      if (feed_plain(data, out, cap, written)) return render_status::ok;
      if (cap < bound(data.size())) return render_status::more_room;
      if (data.size() > k_large_event_bytes_max + k_translation_slack_bytes) return render_status::malformed;
      // The usual event in the kept buffers; a larger one in its own (freed
      // at return, after every view into it is written out).
      std::unique_ptr<char[]> large_copy;
      std::unique_ptr<simdjson::dom::parser> large_parser;
      char* padded = _padded.get();
      simdjson::dom::parser* parser = &_parser;
      if (data.size() > _event_bytes_max) {
        large_copy.reset(new char[data.size() + simdjson::SIMDJSON_PADDING]);
        large_parser = std::make_unique<simdjson::dom::parser>(data.size());
        padded = large_copy.get();
        parser = large_parser.get();
      }
      std::memcpy(padded, data.data(), data.size());
      element root;
      if (parser->parse(padded, data.size(), false).get(root) != simdjson::SUCCESS || !root.is_object()) {
        return render_status::malformed;
      }
      if (!_started) begin(w);
      element e;
      if (root["error"].get(e) == simdjson::SUCCESS && e.is_object()) {
        std::string_view msg = get_string(e, "message");
        end(w, true, msg.empty() ? std::string_view("The backend failed.") : msg);
      } else {
        simdjson::dom::array choices;
        if (root["choices"].get_array().get(choices) == simdjson::SUCCESS) {
          for (element c : choices) {
            if (get_int(c, "index") > 0) continue;  // n > 1 is not rendered: the first answer
            element d;
            if (c["delta"].get(d) == simdjson::SUCCESS && d.is_object()) {
              std::string_view r = get_string(d, "reasoning_content");
              if (r.empty()) r = get_string(d, "reasoning");
              if (!r.empty()) {
                if (_open != open_kind::reasoning) open_block(w, open_kind::reasoning, {}, {});
                delta(w, open_kind::reasoning, r, false);
              }
              const std::string_view text = get_string(d, "content");
              if (!text.empty()) {
                if (_open != open_kind::text) open_block(w, open_kind::text, {}, {});
                delta(w, open_kind::text, text, false);
              }
              simdjson::dom::array calls;
              if (d["tool_calls"].get_array().get(calls) == simdjson::SUCCESS) {
                for (element tc : calls) {
                  const int64_t index = get_int(tc, "index");
                  element fn;
                  std::string_view name, args;
                  if (tc["function"].get(fn) == simdjson::SUCCESS && fn.is_object()) {
                    name = get_string(fn, "name");
                    args = get_string(fn, "arguments");
                  }
                  if (_open != open_kind::tool || index != _tool) {
                    if (_blocks >= k_items_max) return render_status::malformed;
                    std::string_view id = get_string(tc, "id");
                    char made[96];
                    if (id.empty()) {  // a backend that numbers calls only
                      size_t n = 0;
                      const std::string_view pre = "call_";
                      std::memcpy(made, pre.data(), pre.size());
                      n = pre.size();
                      const size_t rid = _ctx.request_id.size() < 64 ? _ctx.request_id.size() : 64;
                      if (rid != 0) std::memcpy(made + n, _ctx.request_id.data(), rid);
                      n += rid;
                      made[n++] = '_';
                      made[n++] = static_cast<char>('0' + _blocks % 10);
                      id = std::string_view(made, n);
                    }
                    open_block(w, open_kind::tool, id, name);
                    _tool = index;
                  }
                  if (!args.empty()) delta(w, open_kind::tool, args, false);
                }
              }
            }
            std::string_view f;
            if (c["finish_reason"].get_string().get(f) == simdjson::SUCCESS) _out.finish_reason = static_finish(f);
            std::string_view stop;
            if (c["stop_reason"].get_string().get(stop) == simdjson::SUCCESS && stop.size() <= sizeof _stop_sequence) {
              std::memcpy(_stop_sequence, stop.data(), stop.size());
              _stop_sequence_len = static_cast<uint8_t>(stop.size());
            }
          }
        }
        element u;
        if (root["usage"].get(u) == simdjson::SUCCESS && u.is_object()) {
          detail::read_chat_usage(u, _out);
        }
      }
    }
  } catch (...) {  // a Responses buffer's growth: out of memory
    return render_status::too_large;
  }
  if (!sink.fits()) return render_status::too_large;
  written = sink.size;
  return render_status::ok;
}

render_status stream_renderer::start(char* out, size_t cap, size_t& written) noexcept {
  written = 0;
  if (_started) return render_status::ok;
  openai::detail::bounded_sink sink{out, cap};
  bw w(sink);
  begin(w);
  if (_d == client_dialect::messages) w.raw("event: ping\ndata: {\"type\":\"ping\"}\n\n");
  if (!sink.fits()) return render_status::too_large;
  written = sink.size;
  return render_status::ok;
}

render_status stream_renderer::finish(bool failed, char* out, size_t cap, size_t& written) noexcept {
  written = 0;
  if (_done) return render_status::ok;
  openai::detail::bounded_sink sink{out, cap};
  bw w(sink);
  try {
    end(w, failed || _out.finish_reason.empty(), "The backend's stream ended before its answer did.");
  } catch (...) {
    return render_status::too_large;
  }
  if (!sink.fits()) return render_status::too_large;
  written = sink.size;
  return render_status::ok;
}

}  // namespace sluice::dialect
