// libFuzzer target: the chunk framing readers that run where the walker has
// already been (h2's chunked_payload_bytes, the relay's dechunk and
// find_usage_chunk, the resumable dechunk_cursor and the usage event
// filter), on arbitrary bytes -- what a relay that lost the chunk
// alignment would hand them. Each must stay inside the input and end; on
// bytes the strict walker takes as whole chunks, each must agree with it.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "sluice/h2/session.hpp"
#include "sluice/http/chunked.hpp"
#include "wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t len) {
  // An exact-size heap copy: ASan sees a read past the end.
  std::vector<char> in(data, data + len);
  const char* p = in.data();

  const sluice::http::whole_chunks w = sluice::http::scan_whole_chunks(p, len);
  SLUICE_FUZZ_CHECK(w.end <= len);
  SLUICE_FUZZ_CHECK(w.payload <= len);
  SLUICE_FUZZ_CHECK(sluice::h2::chunked_payload_bytes(p, len) == w.payload);

  std::vector<char> out(len + 1);
  bool last = false;
  const size_t n = sluice::proxy::dechunk(p, len, out.data(), last);
  SLUICE_FUZZ_CHECK(n <= len);
  // Over the whole chunks alone, dechunk takes exactly what the scan counted.
  bool last_whole = false;
  SLUICE_FUZZ_CHECK(sluice::proxy::dechunk(p, w.end, out.data(), last_whole) == w.payload);

  // The strict walker: where it walks whole chunks from the start, the
  // payload it hands out is what dechunk copied.
  sluice::http::chunk_walker walker;
  std::string walked;
  size_t last_end = 0;
  const sluice::http::chunk_step st = walker.walk(
      p, len, [&](size_t at, size_t k) { walked.append(p + at, k); }, [&](size_t end) { last_end = end; });
  if (st.error == sluice::http::chunk_error::none && last_end != 0) {
    const size_t k = sluice::proxy::dechunk(p, last_end, out.data(), last_whole);
    SLUICE_FUZZ_CHECK(sluice::http::scan_whole_chunks(p, last_end).end == last_end);
    SLUICE_FUZZ_CHECK(k <= walked.size());
    SLUICE_FUZZ_CHECK(std::memcmp(out.data(), walked.data(), k) == 0);
  }

  // The resumable de-chunker takes what dechunk takes from whole chunks,
  // wherever the input is cut.
  {
    sluice::proxy::dechunk_cursor whole, split;
    bool l1 = false, l2 = false;
    const size_t a = whole.feed(p, w.end, out.data(), l1);
    std::string joined(out.data(), a);
    const size_t cut = w.end == 0 ? 0 : data[len - 1] % (w.end + 1);
    size_t b = split.feed(p, cut, out.data(), l2);
    b += split.feed(p + cut, w.end - cut, out.data() + b, l2);
    SLUICE_FUZZ_CHECK(a == w.payload && b == a);
    SLUICE_FUZZ_CHECK(std::memcmp(out.data(), joined.data(), a) == 0);
  }

  // The usage event filter: never more out than in plus what it held, and
  // the same output however the input is cut.
  {
    (void)sluice::proxy::classify_event_prefix(std::string_view(p, len));
    (void)sluice::proxy::usage_object_in_prefix(std::string_view(p, len));
    static sluice::proxy::usage_event_filter f1, f2;
    f1.reset();
    f2.reset();
    std::vector<char> o1(len + sluice::proxy::usage_event_filter::k_hold_bytes_max);
    std::vector<char> o2(len + sluice::proxy::usage_event_filter::k_hold_bytes_max);
    const size_t n1 = f1.feed(p, len, o1.data());
    const size_t cut = len == 0 ? 0 : data[len / 2] % (len + 1);
    size_t n2 = f2.feed(p, cut, o2.data());
    n2 += f2.feed(p + cut, len - cut, o2.data() + n2);
    SLUICE_FUZZ_CHECK(n1 <= len && n1 == n2);
    SLUICE_FUZZ_CHECK(std::memcmp(o1.data(), o2.data(), n1) == 0);
    SLUICE_FUZZ_CHECK(f1.dropped() == f2.dropped());
  }

  size_t begin = 0, end = 0;
  const size_t from = len == 0 ? 0 : data[0] % (len + 1);
  if (sluice::proxy::find_usage_chunk(p, len, from, begin, end)) {
    SLUICE_FUZZ_CHECK(begin < end && end <= len);
    // What it cuts is one whole chunk by the same reader.
    const sluice::http::whole_chunks c = sluice::http::scan_whole_chunks(p + begin, end - begin);
    SLUICE_FUZZ_CHECK(c.end == end - begin && !c.last);
  }
  return 0;
}
