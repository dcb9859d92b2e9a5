// libFuzzer target: a client's bytes, after the 24-byte preface, into
// h2::server_session in random reads, with an owner that answers every
// request at once (a head, a body piece, the end) and consumes every body
// byte; the output is taken in random send sizes between reads. Checks:
// the session's events keep their order (a stream's head before its data,
// closed once and last), a failed feed stays failed, the memory cap holds,
// pending_output() never exceeds output_size(), and a done() session has
// nothing left to send.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string_view>

#include "fuzz_common.hpp"
#include "sluice/h2/session.hpp"

namespace {

namespace h2 = sluice::h2;

constexpr std::string_view k_body = "{\"id\":\"x\",\"object\":\"chat.completion\"}";

struct answering_owner : h2::session_owner {
  h2::server_session* session = nullptr;
  // Per stream: 1 = head seen, 2 = closed.
  std::map<int32_t, int> state;
  uint64_t heads = 0;

  void on_request_head(const h2::request& r) override {
    SLUICE_FUZZ_CHECK(r.stream_id > 0 && (r.stream_id & 1) == 1);
    SLUICE_FUZZ_CHECK(state.count(r.stream_id) == 0);
    state[r.stream_id] = 1;
    ++heads;
    // The HTTP/1-like fields walk the copy and stay inside it.
    sluice::http::header f;
    auto it = r.head.fields();
    uint16_t n = 0;
    while (it.next(f)) {
      SLUICE_FUZZ_CHECK(!f.name.empty());
      ++n;
    }
    SLUICE_FUZZ_CHECK(n == r.head.header_count);
    const h2::field fields[] = {{"content-type", "application/json"}};
    if (session->submit_response(r.stream_id, 200, fields, false)) {
      const iovec v{const_cast<char*>(k_body.data()), k_body.size()};
      SLUICE_FUZZ_CHECK(session->send_body(r.stream_id, {&v, 1}, true));
    }
  }
  void on_request_data(int32_t id, std::span<const char> bytes, bool) override {
    SLUICE_FUZZ_CHECK(state.count(id) == 1 && state[id] == 1);
    session->consume(id, bytes.size());
  }
  void on_body_drained(int32_t id) override { SLUICE_FUZZ_CHECK(state.count(id) == 1 && state[id] == 1); }
  void on_stream_closed(int32_t id, h2::close_cause, uint32_t) override {
    SLUICE_FUZZ_CHECK(state.count(id) == 1 && state[id] == 1);
    state[id] = 2;
  }
  void on_goaway(uint32_t, bool) override {}
};

// Takes some of the output, as a send of random size would.
void drain_some(h2::server_session& s, sluice::fuzz::split_rng& rng) {
  for (int sends = 0; sends < 64 && s.has_output(); ++sends) {
    const auto v = s.pending_output();
    SLUICE_FUZZ_CHECK(!v.empty() && v.size() <= s.output_size());
    const size_t n = 1 + rng.upto(v.size() - 1);
    s.consume_output(n);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::fuzz::split_rng rng(sluice::fuzz::input_hash(data, size));
  h2::options opt;
  // Small limits in some runs, so the defences are reached from short inputs.
  if ((rng.next() & 1) != 0) {
    opt.max_concurrent_streams = 4;
    opt.header_list_bytes_max = 256;
    opt.resets_per_window_max = 4;
    opt.max_outbound_acks = 16;
    opt.memory_bytes_max = 96u << 10;
    opt.output_buffer_bytes = 256;
    opt.stream_window_bytes = 1024;
  }
  answering_owner owner;
  {
    h2::server_session s(owner, opt);
    owner.session = &s;
    SLUICE_FUZZ_CHECK(!s.failed());
    SLUICE_FUZZ_CHECK(s.feed(h2::k_client_preface, 0));
    uint64_t now_ms = 0;
    bool failed = false;
    size_t at = 0;
    while (at < size) {
      const size_t n = rng.piece(size - at);
      const bool ok = s.feed({reinterpret_cast<const char*>(data + at), n}, now_ms);
      if (failed) SLUICE_FUZZ_CHECK(!ok);
      failed = !ok;
      at += n;
      now_ms += rng.upto(300);
      drain_some(s, rng);
      SLUICE_FUZZ_CHECK(s.memory_bytes_peak() <= opt.memory_bytes_max);
    }
    for (int i = 0; i < 100000 && s.has_output(); ++i) s.consume_output(s.pending_output().size());
    if (s.done()) SLUICE_FUZZ_CHECK(!s.has_output());
    SLUICE_FUZZ_CHECK(s.stats().streams_opened == owner.heads);
    SLUICE_FUZZ_CHECK(s.memory_bytes_peak() <= opt.memory_bytes_max);
  }
  return 0;
}
