// One request's exchange: its accounting (open, end, the audit line), its
// id, and the dispatch of a parsed request -- local answers (models,
// overload), the body's fields, the model group, the route key and the
// admission cost -- before it goes to quota admission (admission.cpp) and
// the backend adapter (backend_adapter.hpp).
#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include <xxhash.h>

#include "shard_server.hpp"
#include "client_codec.hpp"
#include "backend_adapter.hpp"
#include "dialect_relay.hpp"
#include "wire.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/clock.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/text.hpp"
#include "sluice/openai/error.hpp"
#include "sluice/quota/estimate.hpp"

namespace sluice::proxy {

void shard_server::open_request(exchange& x) noexcept {
  if (x.request_open) return;
  x.request_open = true;
  x.start_wall_ms = _r.wall_ms();
  _metrics.inflight_add();
}

void shard_server::end_request(exchange& x) noexcept {
  if (!x.request_open) return;
  x.request_open = false;
  const uint64_t now = now_ms();
  if (_metrics.inflight() == 1) send_load_reports(now, true);  // the last one: see send_load_reports
  _metrics.inflight_sub();
  // Tokens: the backend's usage when it sent one; for a stream cut short
  // without it, the content events seen (one token each, as vLLM streams).
  uint64_t prompt = 0, completion = 0;
  if (x.rsp.translated) {
    // A reply sluice translated: its counts are the backend's own (or, cut
    // short, the content pieces seen).
    if (x.rsp.facts.prompt_tokens > 0) prompt = static_cast<uint64_t>(x.rsp.facts.prompt_tokens);
    completion = x.rsp.facts.completion_tokens >= 0 ? static_cast<uint64_t>(x.rsp.facts.completion_tokens)
                                                 : x.rsp.facts.content_events;
  } else if (x.rsp.head_seen && x.rsp.head.event_stream) {
    if (x.rsp.facts.prompt_tokens > 0) prompt = static_cast<uint64_t>(x.rsp.facts.prompt_tokens);
    completion = x.rsp.facts.completion_tokens >= 0 ? static_cast<uint64_t>(x.rsp.facts.completion_tokens)
                                                 : x.rsp.facts.content_events;
  } else if (x.rsp.head_seen && x.mem->body.len != 0 && x.req.native) {
    const dialect::native_usage u = dialect::native_body_usage(x.req.speaks, std::string_view(x.mem->body.data, x.mem->body.len));
    if (u.prompt_tokens > 0) prompt = static_cast<uint64_t>(u.prompt_tokens);
    if (u.completion_tokens > 0) completion = static_cast<uint64_t>(u.completion_tokens);
  } else if (x.rsp.head_seen && x.mem->body.len != 0) {
    // Past its bound the body is its last 64 KiB (scan.cpp): the usage
    // object is read from there.
    const std::string_view body(x.mem->body.data, x.mem->body.len);
    const openai::usage u =
        x.rsp.body_overflow ? openai::scan_usage_in_tail(body) : openai::scan_response_usage(body);
    if (u.prompt_tokens > 0) prompt = static_cast<uint64_t>(u.prompt_tokens);
    if (u.completion_tokens > 0) completion = static_cast<uint64_t>(u.completion_tokens);
    // The first choice's finish_reason. The key followed by `":"` cannot
    // match inside a JSON string, where its quotes would be escaped.
    // find_bytes, not string_view::find: the latter calls memchr once per
    // '"' before the key (bench/RESULTS.md, "Figures behind choices in the
    // code").
    constexpr std::string_view k_finish = "\"finish_reason\":\"";
    const char* hit = find_bytes(body.data(), body.size(), k_finish);
    if (hit != nullptr) {
      const size_t from = static_cast<size_t>(hit - body.data()) + k_finish.size();
      const size_t to = body.find('"', from);
      if (to != std::string_view::npos && to - from <= sizeof x.rsp.facts.finish_reason) {
        std::memcpy(x.rsp.facts.finish_reason, body.data() + from, to - from);
        x.rsp.facts.finish_reason_len = static_cast<uint8_t>(to - from);
      }
    }
  }
  const bool answered = x.rsp.translated ? x.rsp.answered_ok : x.rsp.head_seen && x.rsp.head.status == 200;
  // A stream cut before its usage chunk: the prompt is the estimate.
  if (answered && prompt == 0) prompt = x.input_estimate;
  // A non-stream answer whose client left before its usage was read: the
  // backend sends its head only once it has generated everything, so the
  // output part of the reservation is billed (README: Quota).
  if (answered && !(x.rsp.translated ? x.req.is_stream : x.rsp.head.event_stream) && !x.rsp.complete && completion == 0) {
    completion = x.reserved_output;
  }
  // Settle exactly once: the backend's usage when it answered 200 (a
  // client gone mid-stream pays the prompt and what was streamed); any
  // failure before an answer is refunded.
  if (x.held.live) settle_quota(x, answered ? prompt : 0, answered ? completion : 0);
  // Budgets count what the audit line says was used.
  count_budget(x, prompt, completion);
  fair_end(x, answered ? prompt : 0, answered ? completion : 0);
  const bool grouped = x.group != metrics::none;
  _metrics.request_done(x.group, x.backend_used, x.status);
  static_assert(static_cast<size_t>(dialect::client_dialect::messages) + 1 == metrics::dialect_count);
  static_assert(metrics::dialect_names[static_cast<size_t>(dialect::client_dialect::responses)] == "responses");
  if (x.head_ok && (x.req.model_len != 0 || x.req.speaks != dialect::client_dialect::chat)) {
    _metrics.dialect_done(x.group, static_cast<size_t>(x.req.speaks));
  }
  if (grouped && (prompt | completion) != 0) _metrics.tokens(x.group, prompt, completion);
  _metrics.key_done(x.key_index >= 0 ? static_cast<uint32_t>(x.key_index) : metrics::none, prompt, completion);
  const uint64_t duration_ms = now - x.request_start_ms;
  if (grouped) {
    _metrics.observe_duration_us(x.group, duration_ms * 1000);
    if (x.first_token_ms != 0) _metrics.observe_ttft_us(x.group, (x.first_token_ms - x.request_start_ms) * 1000);
  }
  if (!_audit) return;
  audit::record r;
  r.time_ms = x.start_wall_ms;
  r.request_id = std::string_view(x.request_id, x.request_id_len);
  if (x.key_index >= 0) r.key_id = _cfg->keys[static_cast<size_t>(x.key_index)].id;
  if (x.head_ok) {
    static constexpr std::string_view k_paths[] = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"};
    r.endpoint = x.req.is_models ? std::string_view("/v1/models")
                 : x.req.model_len == 0 ? std::string_view{}
                 : x.req.speaks == dialect::client_dialect::responses ? std::string_view("/v1/responses")
                 : x.req.count_tokens ? std::string_view("/v1/messages/count_tokens")
                 : x.req.speaks == dialect::client_dialect::messages ? std::string_view("/v1/messages")
                                                                 : k_paths[static_cast<int>(x.req.endpoint)];
    r.session_id = x.head.session_id;
  }
  r.model = std::string_view(x.req.model, x.req.model_len);
  if (grouped) r.group = _cfg->groups[x.group].name;
  if (x.backend_used != metrics::none) r.backend = _cfg->backends[x.backend_used].url;
  r.status = x.status;
  r.prompt_tokens = prompt;
  r.completion_tokens = completion;
  r.total_tokens = prompt + completion;
  r.quota_charged = x.quota_charged;
  r.ttft_ms = x.first_token_ms != 0 ? static_cast<int64_t>(x.first_token_ms - x.request_start_ms) : -1;
  r.duration_ms = duration_ms;
  r.stream = x.req.is_stream;
  r.cancelled = x.cancelled;
  r.finish_reason = std::string_view(x.rsp.facts.finish_reason, x.rsp.facts.finish_reason_len);
  r.error = x.error_code;
  if (x.adm.queued_since_ms != 0) r.queued_ms = static_cast<int64_t>(x.adm.queued_ms);
  if (x.head_ok && (x.req.model_len != 0 || x.req.speaks != dialect::client_dialect::chat)) r.dialect = dialect::name(x.req.speaks);
  if (x.route_how != route::decision_how::name) {
    r.route_how = route::to_string(x.route_how);
    r.route_confidence = x.route_confidence;
  }
  _audit->append(r);
}

static_assert(metrics::router_how_count == 5 && static_cast<size_t>(route::decision_how::rule) == 0 &&
                  static_cast<size_t>(route::decision_how::classifier) == 1 &&
                  static_cast<size_t>(route::decision_how::default_group) == 2 &&
                  static_cast<size_t>(route::decision_how::sticky) == 3 &&
                  static_cast<size_t>(route::decision_how::embeddings) == 4,
              "metrics::router_how_names follows route::decision_how");

size_t shard_server::write_response_headers(const exchange& x, char* out, size_t cap) noexcept {
  size_t n = write_rate_headers(x, out, cap);
  // [router] group_header: the group that answered (the auto model's pick).
  if (_cfg->router.group_header && x.group < _cfg->groups.size()) {
    const std::string_view name = _cfg->groups[x.group].name;  // a plain name (config checks it)
    constexpr std::string_view k_field = "x-sluice-group: ";
    if (n + k_field.size() + name.size() + 2 <= cap) {
      std::memcpy(out + n, k_field.data(), k_field.size());
      n += k_field.size();
      std::memcpy(out + n, name.data(), name.size());
      n += name.size();
      out[n++] = '\r';
      out[n++] = '\n';
    }
  }
  return n;
}

void shard_server::cancel(exchange& x) noexcept {
  _metrics.at(metrics::stat::downstream_aborts).add();
  x.cancelled = true;
  x.status = 499;  // nginx's "client closed request"
  x.error_code = "client_closed";
}

void shard_server::make_request_id(exchange& x) noexcept {
  // Keep a client's X-Request-ID when it is a plain token (it reaches logs
  // and the backend); otherwise make one: shard-unique, not guessable.
  std::string_view rid = x.head.request_id;
  bool ok = !rid.empty() && rid.size() < sizeof x.request_id;
  for (char c : rid) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || c == '_' ||
          c == '.' || c == ':')) {
      ok = false;
      break;
    }
  }
  if (ok) {
    std::memcpy(x.request_id, rid.data(), rid.size());
    x.request_id_len = static_cast<uint8_t>(rid.size());
    return;
  }
  uint64_t h = _id_seed + (++_request_seq) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  text_writer w(x.request_id, sizeof x.request_id);
  w.put_hex(_index, 2);
  w.put_hex(h, 16);
  w.put_hex(static_cast<uint32_t>(_request_seq), 8);
  x.request_id_len = static_cast<uint8_t>(w.p - x.request_id);
}

bool shard_server::accept_head(exchange& x, bool has_body) noexcept {
  // Route by path and method before reading the body, so a request
  // sluice will refuse never makes it send 100 Continue or buffer 8 MiB.
  const std::string_view path = x.head.path;
  bool known = true;
  bool method_ok = true;
  // GET / DELETE /v1/responses/{id} that no store can answer: a 404 after
  // the key check, as any request's.
  enum { may_be_kept, no_store, no_such_url } not_kept = may_be_kept;
  if (path == "/v1/chat/completions") {
    x.req.endpoint = openai::endpoint::chat_completions;
    method_ok = x.head.meth == http::method::post;
  } else if (path == "/v1/completions") {
    x.req.endpoint = openai::endpoint::completions;
    x.req.speaks = dialect::client_dialect::completions;
    method_ok = x.head.meth == http::method::post;
  } else if (path == "/v1/embeddings") {
    x.req.endpoint = openai::endpoint::embeddings;
    x.req.speaks = dialect::client_dialect::embeddings;
    method_ok = x.head.meth == http::method::post;
  } else if (path == "/v1/responses") {
    x.req.speaks = dialect::client_dialect::responses;
    method_ok = x.head.meth == http::method::post;
  } else if (path == "/v1/messages" || path == "/v1/messages/count_tokens") {
    x.req.speaks = dialect::client_dialect::messages;
    x.req.count_tokens = path.size() > 12;
    method_ok = x.head.meth == http::method::post;
  } else if (path == "/v1/models" || (path.starts_with("/v1/models/") && path.size() > 11)) {
    method_ok = x.head.meth == http::method::get;
    x.req.is_models = true;
  } else if (path.starts_with("/v1/responses/") && path.size() > 14) {
    // GET / DELETE /v1/responses/{id}: served from the response store
    // ([responses] store), after the key is checked (each key sees its own).
    x.req.speaks = dialect::client_dialect::responses;
    if (x.head.meth != http::method::get && x.head.meth != http::method::delete_) {
      method_ok = false;
    } else if (_cfg->responses.store == config::response_store_mode::off) {
      not_kept = no_store;  // answered once the key is known: nothing of the setup before it
    } else if (const std::string_view id = path.substr(14); id.size() > 128 || id.find('/') != std::string_view::npos) {
      not_kept = no_such_url;
    } else {
      try {
        x.mem->store_id.assign(id);
      } catch (...) {
        x.codec->answer_error(x, 500, "Internal error.", "server_error", {}, {}, has_body);
        return false;
      }
      x.req.store_call = x.head.meth == http::method::get ? canonical_request::store_verb::get
                                                          : canonical_request::store_verb::remove;
    }
  } else {
    known = false;
  }
  if (!known) {
    x.codec->answer_error(x, 404, "Unknown request URL. Please check the URL and method.", "invalid_request_error", {},
                 "unknown_url", has_body);
    return false;
  }
  if (!method_ok) {
    x.codec->answer_error(x, 405, "Method not allowed for this URL.", "invalid_request_error", {},
                 "method_not_allowed", has_body);
    return false;
  }
  // The key as Authorization: Bearer, or as x-api-key (Anthropic's SDK).
  x.key_index = _keys.find(x.head.authorization, x.head.api_key, _cfg->keys);
  if (x.key_index < 0) {
    x.codec->answer_error(x, 401,
                 !x.head.authorization.empty() || !x.head.api_key.empty() ? "Incorrect API key provided."
                 : x.req.speaks == dialect::client_dialect::messages
                     ? "x-api-key header is required (or Authorization: Bearer YOUR_KEY)."
                     : "You didn't provide an API key. You need to provide your API key in an Authorization "
                       "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                 "invalid_request_error", {}, "invalid_api_key", has_body);
    return false;
  }
  if (not_kept == no_store) {
    x.codec->answer_error(x, 404,
                          "No response with this id is kept here: this gateway has no response store "
                          "([responses] store).",
                          "invalid_request_error", {}, "not_found", has_body);
    return false;
  }
  if (not_kept == no_such_url) {
    x.codec->answer_error(x, 404, "Unknown request URL. Please check the URL and method.", "invalid_request_error", {},
                          "unknown_url", has_body);
    return false;
  }
  return true;
}

void shard_server::dispatch(exchange& x) noexcept {
  // From here the exchange is the policy's: no client deadline runs.
  x.codec->wait_for_backend(x, deadline_kind::none, 0);
  _metrics.at(metrics::stat::requests_total).add();
  _metrics.at(metrics::stat::requests_inflight).add();
  x.inflight_counted = true;
  if (x.req.is_models) {
    answer_models(x);
    return;
  }
  if (x.req.store_call != canonical_request::store_verb::none) {
    ask_store(x, x.req.store_call == canonical_request::store_verb::get ? store_op::kind::get : store_op::kind::remove);
    return;
  }
  // The shard's in-flight and memory caps: answered before the body is
  // parsed, so an overloaded shard spends as little as possible on what it
  // refuses, and before the exchange takes upstream buffers.
  const uint64_t memory_max = _cfg->server.memory_max_bytes;
  const bool over_memory = memory_max != 0 && connection_memory_bytes() > static_cast<int64_t>(memory_max);
  if (_metrics.at(metrics::stat::requests_inflight).get() > _cfg->server.inflight_max || over_memory) {
    _metrics.at(over_memory ? metrics::stat::shed_memory : metrics::stat::shed_requests).add();
    x.codec->answer_error(x, 503, "The server is overloaded. Please try again.", "server_error", {}, "overloaded", false,
                 "retry-after: 1\r\n");
    return;
  }
  route_request(x);
}

void shard_server::route_request(exchange& x) noexcept {
  openai::request_fields f;
  openai::request_error e;
  // The widest cap a group may have; the group's own cap is checked once
  // the model named its group (below).
  const int64_t cap = 1 << 20;
  std::string_view body = x.codec->request_body(x);
  x.req.native = false;
  if (translated_request(x)) {
    // A Responses or Messages request: written once as the canonical chat
    // body, which policy and the adapters read from here on.
    if (!translate_request(x, body)) return;  // answered
    body = x.req.body;
  }
  if (!_reader.read(x.req.endpoint, body.data(), body.size(), cap, f, e)) {
    x.codec->answer_error(x, 400, e.message, "invalid_request_error", e.param, e.code, false);
    return;
  }
  x.req.model_len = static_cast<uint8_t>(f.model.size() < sizeof x.req.model ? f.model.size() : sizeof x.req.model);
  std::memcpy(x.req.model, f.model.data(), x.req.model_len);
  x.req.is_stream = f.stream;
  // Model -> group (names, patterns, `auto` rules), limited to the groups
  // the key may use: a model outside them reads as unknown (no leak).
  // The auto model: rules, the classifier, the default (groups.hpp).
  route::decision dec;
  if (x.embed == exchange::embed_step::decided) {  // an embeddings call decided (embed_router)
    dec.group = x.route_group;
    dec.how = x.route_how;
    dec.confidence = x.route_confidence;
  } else {
    route::group_table& groups = _routes->groups();
    dec = groups.resolve_decision(f, static_cast<uint32_t>(x.key_index), !x.head.session_id.empty(),
                                  x.embed != exchange::embed_step::fallback);
    if (dec.pending) {
      _metrics.at(metrics::stat::router_embeddings_cache_misses).add();
      if (_embed.start(x, groups.pending_input())) {
        x.codec->wait_for_quota(x);  // parked: the call's end goes on with route_request()
        return;
      }
      dec = groups.resolve_decision(f, static_cast<uint32_t>(x.key_index), !x.head.session_id.empty(), false);
    } else if (dec.cached) {
      _metrics.at(metrics::stat::router_embeddings_cache_hits).add();
    }
  }
  const uint32_t g = dec.group;
  x.route_how = dec.how;
  x.route_confidence = dec.confidence;
  if (g != route::k_none && dec.how != route::decision_how::name) {
    _metrics.router_decision(g, static_cast<size_t>(dec.how));
  }
  if (g == route::k_none) {
    const size_t shown = f.model.size() > 128 ? 128 : f.model.size();
    char quoted[160];
    const size_t ql = openai::json_escape(quoted, sizeof quoted, f.model.substr(0, shown));
    auto msg = fmt::format_to_n(x.scratch, sizeof x.scratch,
                                "The model `{}` does not exist or you do not have access to it.",
                                std::string_view(quoted, ql));
    x.codec->answer_error(x, 404, std::string_view(x.scratch, msg.size < sizeof x.scratch ? msg.size : sizeof x.scratch),
                 "invalid_request_error", "model", "model_not_found", false);
    return;
  }
  x.group = g;
  const config::group_config& grp = _cfg->groups[g];
  if (translated_request(x) && !x.req.count_tokens && !pass_native(x, grp)) return;  // answered
  if (x.req.continues && !x.req.native) {
    // A translated group has no state of its own to continue from: the
    // store's conversation is read before the request's input.
    if (_cfg->responses.store == config::response_store_mode::off) {
      x.codec->answer_error(x, 400,
                            "previous_response_id needs a response store, and this gateway keeps none for this model: "
                            "send the conversation as input items, or set [responses] store.",
                            "invalid_request_error", "previous_response_id", "unsupported_parameter", false);
      return;
    }
    if (!x.req.history_fetched) {
      ask_store(x, store_op::kind::get);  // parked: the answer calls route_request() again
      return;
    }
  }
  if (x.req.continues && x.req.native && x.req.speaks == dialect::client_dialect::responses && !x.req.route_fetched) {
    // The group's backends hold the conversation: the request goes to the
    // one that made the response it continues, as far as sluice saw it.
    x.req.route_fetched = true;
    if (ask_store(x, store_op::kind::route_get)) return;  // parked: the answer calls route_request() again
  }
  x.req.keep_route = x.req.keep_route && x.req.native;
  x.req.store_put = x.req.store_put && !x.req.native;
  const uint64_t group_cap = grp.max_tokens_cap != 0 ? grp.max_tokens_cap : _cfg->quota.max_tokens_cap;
  if (f.max_tokens > 0 && static_cast<uint64_t>(f.max_tokens) > group_cap) {
    const std::string_view field = f.max_tokens_named_completion ? "max_completion_tokens" : "max_tokens";
    auto msg = fmt::format_to_n(x.scratch, sizeof x.scratch,
                                "{} is too large: {}. This model supports at most {} completion tokens, whereas you "
                                "provided {}.",
                                field, f.max_tokens, group_cap, f.max_tokens);
    x.codec->answer_error(x, 400, std::string_view(x.scratch, msg.size < sizeof x.scratch ? msg.size : sizeof x.scratch),
                 "invalid_request_error", field, "invalid_value", false);
    return;
  }
  x.total_deadline_ms = grp.upstream.total_timeout_ms != 0 ? now_ms() + grp.upstream.total_timeout_ms : 0;
  _prng ^= _prng << 13;
  _prng ^= _prng >> 7;
  _prng ^= _prng << 17;
  x.route_key = route::route_key(_routes->keys(g), x.req.endpoint, f, grp.name, x.head.session_id, _prng);
  x.route_key.pinned = x.req.pinned_backend;
  // Admission cost: estimated input tokens x input_weight + max_tokens (or
  // the group's default cap) x output_weight (docs/architecture.md §4), for each answer
  // the backend generates (n, best_of, prompts of a completions batch).
  const uint64_t default_max = grp.default_max_tokens != 0 ? grp.default_max_tokens : _cfg->quota.default_max_tokens;
  const uint64_t max_tokens = f.max_tokens > 0 ? static_cast<uint64_t>(f.max_tokens)
                              : default_max < group_cap ? default_max
                                                        : group_cap;
  uint64_t max_out = 0;
  if (__builtin_mul_overflow(max_tokens, f.output_sequences, &max_out)) max_out = UINT64_MAX;
  x.reserved_output = max_out;
  x.input_estimate = quota::estimate_request_tokens(*f.text, f.message_count, _cfg->quota.image_tokens);
  x.quota_cost = quota::admission_cost(x.input_estimate, max_out, _cfg->quota.input_weight,
                                        _cfg->quota.output_weight);
  if (x.req.count_tokens) {
    // sluice's own estimate (the admission one), not the model's tokenizer.
    char answer[64];
    auto n = fmt::format_to_n(answer, sizeof answer, "{{\"input_tokens\":{}}}", x.input_estimate);
    x.codec->answer(x, 200, std::string_view(answer, n.size), false, {}, {});
    return;
  }
  // The backend's request is built now, while `f` (views into this
  // shard's reader) is valid: admission may park the exchange.
  // The codec bound the OpenAI adapter; a group of another protocol has its own.
  if (grp.protocol != config::backend_protocol::openai) x.adapter = adapter_for(grp.protocol);
  if (!x.adapter->prepare(x, f)) return;  // answered
  x.attempts = 0;
  x.tried_mask = 0;
  admit(x);
}

bool shard_server::translate_request(exchange& x, std::string_view body) noexcept {
  openai::request_error e;
  dialect::translated_request t;
  std::string& out = x.mem->dialect_body;
  bool ok = false;
  const bool store = _cfg->responses.store != config::response_store_mode::off;
  try {
    if (x.req.speaks == dialect::client_dialect::messages) {
      ok = _translator.messages(body, x.req.count_tokens, out, t, e);
    } else {
      ok = _translator.responses(body, out, t, e, x.req.history_fetched ? std::string_view(x.mem->store_history) : std::string_view(),
                                 store ? &x.mem->store_items : nullptr);
      if (ok && !t.previous_response_id.empty()) x.mem->store_id.assign(t.previous_response_id);
    }
    out.reserve(out.size() + simdjson::SIMDJSON_PADDING);  // the reader parses it in place
  } catch (...) {  // the string's growth: out of memory
    x.codec->answer_error(x, 500, "Internal error.", "server_error", {}, {}, true);
    return false;
  }
  if (!ok) {
    x.codec->answer_error(x, 400, e.message, "invalid_request_error", e.param, e.code, false);
    return false;
  }
  x.req.continues = !t.previous_response_id.empty();
  x.req.store_put = store && t.store && x.req.speaks == dialect::client_dialect::responses;
  x.req.keep_route = t.store && x.req.speaks == dialect::client_dialect::responses;  // (native groups only)
  x.req.body = out;
  return true;
}

bool shard_server::pass_native(exchange& x, const config::group_config& grp) noexcept {
  const uint8_t bit = x.req.speaks == dialect::client_dialect::messages ? config::native::messages : config::native::responses;
  if ((grp.native_dialects & bit) == 0) return true;  // translated
  // Passed through: sluice read the request as the canonical body, so the
  // backend must not be able to read the client's bytes another way.
  const std::string_view body = x.codec->request_body(x);
  const dialect::member_scan m = dialect::top_level_member(body, "model", x.req.native_model_begin, x.req.native_model_end);
  if (m != dialect::member_scan::found) {
    x.codec->answer_error(x, 400,
                          m == dialect::member_scan::duplicate ? "A top-level member is given twice."
                          : m == dialect::member_scan::escaped ? "A top-level member name holds an escape."
                                                               : "The request body could not be read.",
                          "invalid_request_error", {}, {}, false);
    return false;
  }
  x.req.native = true;
  return true;
}

namespace {

// A percent-decoded path segment (the SDKs put a model id with '/' in the
// path as it is, or as %2F). Returns: its length, or SIZE_MAX when it does
// not fit or holds a bad escape.
size_t decode_segment(std::string_view in, char* out, size_t cap) noexcept {
  size_t n = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (in.size() - i < 3) return SIZE_MAX;  // "%" needs two hex digits after it
      const int hi = hex_digit(in[i + 1]), lo = hex_digit(in[i + 2]);
      if (hi < 0 || lo < 0) return SIZE_MAX;
      c = static_cast<char>(hi * 16 + lo);
      i += 2;
    }
    if (n == cap) return SIZE_MAX;
    out[n++] = c;
  }
  return n;
}

}  // namespace

void shard_server::answer_models(exchange& x) noexcept {
  const uint32_t key = static_cast<uint32_t>(x.key_index);
  const route::group_table& groups = _routes->groups();
  byte_buf& b = x.mem->body;  // unused by local answers: the body is built here
  b.len = 0;
  auto put = [&](std::string_view s) {
    std::memcpy(b.data + b.len, s.data(), s.size());
    b.len += static_cast<uint32_t>(s.size());
  };
  auto put_model = [&](std::string_view id) {
    put("{\"id\":\"");
    b.len += static_cast<uint32_t>(openai::json_escape(b.data + b.len, id.size() * 6, id));
    put("\",\"object\":\"model\",\"created\":0,\"owned_by\":\"sluice\"}");
  };
  const std::string_view path = x.head.path;
  if (path.size() > 11) {
    // GET /v1/models/{id} (the SDKs' models.retrieve): a model the key may
    // use -- by name or pattern, as a request's `model` would resolve --
    // else 404, the same answer as for a model that does not exist.
    char id[256];
    const size_t n = decode_segment(path.substr(11), id, sizeof id);
    const std::string_view model = n == SIZE_MAX ? std::string_view{} : std::string_view(id, n);
    const uint32_t g = model.empty() ? route::k_none : groups.find(model);
    if (g == route::k_none || !groups.key_allows(key, g)) {
      const size_t shown = model.size() > 128 ? 128 : model.size();
      char quoted[160];
      const size_t ql = openai::json_escape(quoted, sizeof quoted, model.substr(0, shown));
      auto msg = fmt::format_to_n(x.scratch, sizeof x.scratch, "The model '{}' does not exist",
                                  std::string_view(quoted, ql));
      x.codec->answer_error(x, 404, std::string_view(x.scratch, msg.size < sizeof x.scratch ? msg.size : sizeof x.scratch),
                   "invalid_request_error", "model", "model_not_found", false);
      return;
    }
    if (!b.reserve(model.size() * 6 + 128)) {
      x.codec->fail(x);
      return;
    }
    put_model(model);
    x.codec->answer(x, 200, std::string_view(b.data, b.len), false, {}, {});
    return;
  }
  // The exact model names of the groups the key may use (patterns are not
  // names a client can list).
  size_t need = 64;
  for (uint32_t g = 0; g < _cfg->groups.size(); ++g) {
    const config::group_config& grp = _cfg->groups[g];
    if (grp.removed || !groups.key_allows(key, g)) continue;
    need += grp.name.size() * 6 + 96;
    for (const auto& m : grp.models) need += m.size() * 6 + 96;
  }
  if (!b.reserve(need)) {
    x.codec->fail(x);
    return;
  }
  put("{\"object\":\"list\",\"data\":[");
  bool first = true;
  auto add_model = [&](std::string_view id) {
    if (!first) put(",");
    first = false;
    put_model(id);
  };
  for (uint32_t g = 0; g < _cfg->groups.size(); ++g) {
    const config::group_config& grp = _cfg->groups[g];
    if (grp.removed || !groups.key_allows(key, g)) continue;
    bool listed_name = false;
    for (const auto& m : grp.models) {
      if (m.find_first_of("*?[") != std::string::npos) continue;
      add_model(m);
      if (m == grp.name) listed_name = true;
    }
    if (!listed_name) add_model(grp.name);
  }
  put("]}");
  x.codec->answer(x, 200, std::string_view(b.data, b.len), false, {}, {});
}

}  // namespace sluice::proxy
