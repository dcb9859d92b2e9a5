// libFuzzer target: the chunk framing readers that run where the walker has
// already been (h2's chunked_payload_bytes, the relay's dechunk and
// find_usage_chunk), on arbitrary bytes -- what a relay that lost the chunk
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
