// openai: an OpenAI completions / chat completions request -> the KServe v2
// ModelInferRequest a Triton text model takes, gRPC-framed.
//
// sluice always asks Triton to stream (`stream` true), whether or not the
// client did: one code path for both, the text arrives as deltas that a
// stream client gets as they come and a non-stream client gets assembled
// into one body (triton_stream's accumulate mode), and vLLM's backend sends
// the token counts on its responses either way. A non-stream call would end
// in one response just as late, so nothing is lost by streaming.
//
// What a text model cannot do is refused here with a 400 naming the member,
// before a byte goes upstream: Triton would otherwise ignore it silently
// (the client asked for tools or JSON and would get prose).
#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <span>
#include <utility>

#include "json_writer.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/text.hpp"
#include "sluice/grpc/kserve.hpp"
#include "sluice/openai/triton.hpp"

namespace sluice::openai {

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;
using member = request_fields::member;

bool refuse(request_error& err, std::string_view message, std::string_view param) noexcept {
  err.message = message;
  err.param = param;
  err.code = {};
  return false;
}

bool is_number(const element& v) noexcept {
  const element_type t = v.type();
  return t == element_type::INT64 || t == element_type::UINT64 || t == element_type::DOUBLE;
}

// A sampling number in [lo, hi] (open at lo when `lo_open`). Returns: false
// with `err` set (message formatted into `scratch`) otherwise.
bool check_number(const member& m, std::string_view name, double lo, double hi, bool lo_open, char* scratch,
                  size_t scratch_size, request_error& err) noexcept {
  if (!m.present) return true;
  if (!is_number(m.value)) {
    text_writer w(scratch, scratch_size);
    w.put("Invalid type for '");
    w.put(name);
    w.put("': expected a number.");
    return refuse(err, std::string_view(scratch, static_cast<size_t>(w.p - scratch)), name);
  }
  double d = 0;
  if (m.value.get_double().get(d) != simdjson::SUCCESS) d = 0;
  if (d < lo || d > hi || (lo_open && d == lo)) {
    text_writer w(scratch, scratch_size);
    w.put("Invalid '");
    w.put(name);
    w.put("': the value is out of range for this model group.");
    return refuse(err, std::string_view(scratch, static_cast<size_t>(w.p - scratch)), name);
  }
  return true;
}

double number_of(const member& m) noexcept {
  double d = 0;
  if (m.value.get_double().get(d) != simdjson::SUCCESS) d = 0;
  return d;
}

template <class Sink>
void put_number(detail::json_writer<Sink>& w, const element& v) {
  switch (v.type()) {
    case element_type::INT64: w.num(int64_t(v)); break;
    case element_type::UINT64: {
      char buf[24];
      auto r = std::to_chars(buf, buf + sizeof buf, uint64_t(v));
      w.raw(std::string_view(buf, static_cast<size_t>(r.ptr - buf)));
      break;
    }
    default: w.num(double(v)); break;
  }
}

// What a text model cannot carry, by top-level member.
bool refuse_unsupported(const request_fields& f, request_error& err) noexcept {
  if (f.has_tools) return refuse(err, "This model group's Triton backend takes a text prompt: 'tools' are not supported.", "tools");
  // "none" and "auto" with no tools ask for plain text: harmless.
  for (auto [m, name] : {std::pair{&f.tool_choice, std::string_view("tool_choice")},
                         std::pair{&f.function_call, std::string_view("function_call")}}) {
    if (!m->present) continue;
    std::string_view s;
    if (m->value.get_string().get(s) == simdjson::SUCCESS && (s == "none" || s == "auto")) continue;
    return refuse(err,
                  name == "tool_choice"
                      ? "This model group's Triton backend takes a text prompt: 'tool_choice' is not supported."
                      : "This model group's Triton backend takes a text prompt: 'function_call' is not supported.",
                  name);
  }
  if (f.response_format.present) {
    std::string_view type;
    if (!f.response_format.value.is_object() ||
        f.response_format.value["type"].get_string().get(type) != simdjson::SUCCESS || type != "text") {
      return refuse(err,
                    "This model group's Triton backend takes a text prompt: 'response_format' "
                    "(json_object, json_schema) is not supported.",
                    "response_format");
    }
  }
  if (f.logprobs.present) {
    bool b = true;
    if (f.logprobs.value.get_bool().get(b) != simdjson::SUCCESS || b) {
      return refuse(err, "This model group's Triton backend does not return log probabilities: 'logprobs' is not supported.",
                    "logprobs");
    }
  }
  if (f.top_logprobs.present) {
    int64_t k = 1;
    if (f.top_logprobs.value.get_int64().get(k) != simdjson::SUCCESS || k != 0) {
      return refuse(err,
                    "This model group's Triton backend does not return log probabilities: 'top_logprobs' is not supported.",
                    "top_logprobs");
    }
  }
  if (f.has_images) {
    return refuse(err, "This model group's Triton backend takes a text prompt: image content parts are not supported.",
                  "messages");
  }
  if (f.n > 1) return refuse(err, "This model group's Triton backend returns one choice: 'n' must be 1.", "n");
  if (f.best_of > 1) {
    return refuse(err, "This model group's Triton backend returns one choice: 'best_of' must be 1.", "best_of");
  }
  return true;
}

// "stop": a string or an array of strings, none empty; into `stops`.
bool read_stop(const member& m, std::array<std::string_view, triton_request_writer::k_stop_max>& stops, size_t& count,
               request_error& err) noexcept {
  count = 0;
  if (!m.present) return true;
  constexpr std::string_view bad = "Invalid 'stop': expected a non-empty string or an array of non-empty strings.";
  std::string_view s;
  if (m.value.get_string().get(s) == simdjson::SUCCESS) {
    if (s.empty()) return refuse(err, bad, "stop");
    stops[count++] = s;
    return true;
  }
  simdjson::dom::array list;
  if (m.value.get_array().get(list) != simdjson::SUCCESS) return refuse(err, bad, "stop");
  for (element item : list) {
    if (item.get_string().get(s) != simdjson::SUCCESS || s.empty()) return refuse(err, bad, "stop");
    if (count == stops.size()) {
      return refuse(err, "Invalid 'stop': this model group takes at most 16 stop strings.", "stop");
    }
    stops[count++] = s;
  }
  return true;
}

// Bytes the templates add around each message, above the content: the
// longest built-in (llama3's headers and <|eot_id|>) is under 64.
size_t template_bytes_per_message(const chat_template& t) noexcept {
  const custom_chat_template& c = t.custom;
  size_t n = 128;
  if (t.kind == chat_template_kind::custom) {
    n += c.begin.size() + c.system_prefix.size() + c.system_suffix.size() + c.user_prefix.size() +
         c.user_suffix.size() + c.assistant_prefix.size() + c.assistant_suffix.size() + c.generation_prefix.size();
  }
  return n;
}

}  // namespace

triton_request_writer::triton_request_writer(size_t prompt_bytes_max) : _prompt_bytes_max(prompt_bytes_max) {}

bool triton_request_writer::render_prompt(const triton_request_options& opts, const request_fields& f,
                                          std::string_view& prompt, request_error& err) {
  // A first guess from the content bytes; text parts joined with "\n" and
  // long templates can pass it, so a render that ran out of room is retried
  // in twice the room, up to the bound (the guess fits nearly always).
  size_t want = f.input_bytes + (size_t{f.message_count} + 2) * template_bytes_per_message(opts.prompt_template);
  want = std::min(want, _prompt_bytes_max);
  for (;;) {
    if (_prompt.size() < want) _prompt.resize(want);
    text_writer w(_prompt.data(), want);
    if (render_chat_prompt(opts.prompt_template, f, w, err)) {
      prompt = std::string_view(_prompt.data(), static_cast<size_t>(w.p - _prompt.data()));
      return true;
    }
    if (w.ok || want >= _prompt_bytes_max) return false;  // refused for its content, or too long
    want = std::min(want * 2, _prompt_bytes_max);
  }
}

bool triton_request_writer::write(const triton_request_options& opts, const request_fields& f, endpoint e,
                                  std::string& out, request_error& err) {
  err = request_error{};
  if (e == endpoint::embeddings) {
    return refuse(err, "This model group's Triton backend generates text: /v1/embeddings is not served here.", {});
  }
  if (!refuse_unsupported(f, err)) return false;

  std::string_view prompt;
  if (e == endpoint::chat_completions) {
    if (!render_prompt(opts, f, prompt, err)) return false;
  } else {
    constexpr std::string_view one_prompt =
        "This model group's Triton backend takes one text prompt: 'prompt' must be a string (or an "
        "array of one string).";
    if (!f.prompt.present) return refuse(err, "Missing required parameter: 'prompt'.", "prompt");
    simdjson::dom::array list;
    if (f.prompt.value.get_string().get(prompt) != simdjson::SUCCESS) {
      if (f.prompt.value.get_array().get(list) != simdjson::SUCCESS || list.size() != 1 ||
          list.at(0).get_string().get(prompt) != simdjson::SUCCESS) {
        return refuse(err, one_prompt, "prompt");
      }
    }
  }

  // Sampling members: types and ranges as vLLM's SamplingParams checks them
  // (TensorRT-LLM checks none, and bad values there make bad output).
  char* scratch = _message;
  const size_t scratch_size = sizeof _message;
  if (!check_number(f.temperature, "temperature", 0, 2, false, scratch, scratch_size, err) ||
      !check_number(f.top_p, "top_p", 0, 1, true, scratch, scratch_size, err) ||
      !check_number(f.presence_penalty, "presence_penalty", -2, 2, false, scratch, scratch_size, err) ||
      !check_number(f.frequency_penalty, "frequency_penalty", -2, 2, false, scratch, scratch_size, err)) {
    return false;
  }
  const bool seed_unsigned = opts.flavor == triton_flavor::trtllm;  // random_seed is UINT64
  if (f.seed.present) {
    const element_type t = f.seed.value.type();
    if (t != element_type::INT64 && t != element_type::UINT64) {
      return refuse(err, "Invalid type for 'seed': expected an integer.", "seed");
    }
    if (t == element_type::UINT64 && !seed_unsigned) {
      return refuse(err, "Invalid 'seed': the value is out of range for this model group.", "seed");
    }
    if (t == element_type::INT64 && seed_unsigned && int64_t(f.seed.value) < 0) {
      return refuse(err, "Invalid 'seed': this model group takes a seed from 0 to 2^64-1.", "seed");
    }
  }
  std::array<std::string_view, k_stop_max> stops{};
  size_t stop_count = 0;
  if (!read_stop(f.stop, stops, stop_count, err)) return false;

  const int64_t max_tokens = f.max_tokens > 0 ? f.max_tokens : opts.default_max_tokens;
  SLUICE_ASSERT(max_tokens > 0);

  using grpc::infer_input;
  using grpc::infer_parameter;
  using grpc::tensor_type;
  // Triton sends an empty response with the final flag when the model's
  // last one had none: the end of the reply is always seen.
  const std::array<infer_parameter, 1> parameters{
      infer_parameter::of_bool("triton_enable_empty_final_response", true)};
  const std::array<std::string_view, 1> text{prompt};
  std::array<infer_input, 10> inputs{};
  size_t count = 0;

  // trtllm's ensemble batches on the first dimension: [1, 1] tensors.
  static constexpr std::array<int64_t, 2> shape_1x1{1, 1};
  std::array<int64_t, 2> shape_stops{1, static_cast<int64_t>(stop_count)};
  std::array<std::string_view, 1> sampling{};

  if (opts.flavor == triton_flavor::vllm) {
    // sampling_parameters: the JSON object the backend hands to SamplingParams.
    _params.clear();
    detail::string_sink sink{_params};
    detail::json_writer w(sink);
    w.raw("{\"max_tokens\":");
    w.num(max_tokens);
    for (auto [m, key] : {std::pair{&f.temperature, std::string_view(",\"temperature\":")},
                          std::pair{&f.top_p, std::string_view(",\"top_p\":")},
                          std::pair{&f.seed, std::string_view(",\"seed\":")},
                          std::pair{&f.presence_penalty, std::string_view(",\"presence_penalty\":")},
                          std::pair{&f.frequency_penalty, std::string_view(",\"frequency_penalty\":")}}) {
      if (!m->present) continue;
      w.raw(key);
      put_number(w, m->value);
    }
    if (stop_count > 0) {
      w.raw(",\"stop\":[");
      for (size_t i = 0; i < stop_count; ++i) {
        if (i > 0) w.raw(",");
        w.str(stops[i]);
      }
      w.raw("]");
    }
    w.raw("}");
    sampling[0] = _params;
    inputs[count++] = infer_input::of_bytes("text_input", text);
    inputs[count++] = infer_input::of_bool("stream", true);
    inputs[count++] = infer_input::of_bytes("sampling_parameters", sampling);
    inputs[count++] = infer_input::of_bool("exclude_input_in_output", true);
    inputs[count++] = infer_input::of_bool("return_finish_reason", true);
    inputs[count++] = infer_input::of_bool("return_num_input_tokens", true);
    inputs[count++] = infer_input::of_bool("return_num_output_tokens", true);
  } else {
    if (max_tokens > INT32_MAX) {
      return refuse(err, "Invalid 'max_tokens': this model group takes at most 2147483647.", "max_tokens");
    }
    auto one_by_one = [&](infer_input in) {
      in.shape = shape_1x1;
      inputs[count++] = in;
    };
    one_by_one(infer_input::of_bytes("text_input", text));
    one_by_one(infer_input::of_int32("max_tokens", static_cast<int32_t>(max_tokens)));
    one_by_one(infer_input::of_bool("stream", true));
    for (auto [m, name] : {std::pair{&f.temperature, std::string_view("temperature")},
                           std::pair{&f.top_p, std::string_view("top_p")},
                           std::pair{&f.presence_penalty, std::string_view("presence_penalty")},
                           std::pair{&f.frequency_penalty, std::string_view("frequency_penalty")}}) {
      if (m->present) one_by_one(infer_input::of_fp32(name, static_cast<float>(number_of(*m))));
    }
    if (f.seed.present) {
      infer_input in;
      in.name = "random_seed";
      in.type = tensor_type::uint64;
      in.number.uint64 = f.seed.value.type() == element_type::UINT64 ? uint64_t(f.seed.value)
                                                                      : static_cast<uint64_t>(int64_t(f.seed.value));
      one_by_one(in);
    }
    if (stop_count > 0) {
      infer_input in = infer_input::of_bytes("stop_words", std::span(stops.data(), stop_count));
      in.shape = shape_stops;
      inputs[count++] = in;
    }
  }
  SLUICE_ASSERT(count <= inputs.size());

  grpc::infer_request request;
  request.model_name = opts.model;
  request.id = opts.request_id;
  request.parameters = parameters;
  request.inputs = std::span(inputs.data(), count);
  const size_t bytes = grpc::k_frame_header_bytes + grpc::encoded_size(request);
  if (bytes > UINT32_MAX) {
    return refuse(err, "The rendered prompt is longer than this model group accepts.", "messages");
  }
  out.resize(bytes);
  SLUICE_VERIFY(grpc::encode_frame(request, out.data(), out.size()) == bytes);
  return true;
}

}  // namespace sluice::openai
