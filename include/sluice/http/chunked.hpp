#pragma once
// http: the chunked transfer coding (RFC 9112 §7.1), walked strictly and
// resumable at any byte. One walker serves both directions: a request body
// is decoded in place (request_parser::decode_chunked), a backend's response
// body is only read -- its bytes go to the client unchanged -- and its
// payload handed to the scan. Strict: hex sizes of at most 16 digits, CRLF
// everywhere, extensions skipped (bounded per chunk), trailer fields checked
// like header lines (token name, no whitespace before the colon, no fold, no
// control characters) and dropped.
//
// Shard-local, one per message; reset() between messages.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "sluice/core/text.hpp"

namespace sluice::http {

struct chunk_limits {
  uint64_t body_bytes_max = UINT64_MAX;     // payload total
  uint64_t framing_bytes_max = UINT64_MAX;  // size lines, extensions and CRLFs (trailers aside)
  uint32_t trailer_bytes_max = 64u << 10;
  uint16_t trailer_fields_max = 100;
};

enum class chunk_error : uint8_t {
  none,
  size_too_many_digits,
  invalid_size,
  bare_lf_in_size_line,
  bare_lf_in_extension,
  ctl_in_extension,
  extension_too_long,
  bare_cr_in_size_line,
  data_not_followed_by_crlf,
  body_too_large,
  framing_too_large,
  trailer_too_large,
  too_many_trailer_fields,
  trailer_obs_fold,
  invalid_trailer_field,
  trailer_space_before_colon,
  bare_lf_in_trailer,
  ctl_in_trailer,
  bare_cr_in_trailer,
  bare_cr_after_last_chunk,
};

// A static, human-readable reason.
std::string_view chunk_message(chunk_error e) noexcept;

struct chunk_step {
  size_t consumed = 0;      // bytes used; when done, just past the final CRLF
  bool done = false;        // the last chunk and the trailer section were read
  chunk_error error = chunk_error::none;  // sticky; `consumed` is then where it was found
  // The offset just past the last chunk (its data and CRLF) that ended in
  // this call, or 0 when none did; when done, the end of the message.
  size_t chunk_end = 0;
};


// Chunk framing read again where the walker has already been over it (a
// relay's batch of whole chunks, handed on to a codec that takes the
// framing off). Bounded as the walker is, so bytes it never vouched for
// (a batch cut in the middle of a chunk) cannot make them loop, wrap or
// read past `n`: at most 16 hex digits (a uint64_t cannot wrap), the size
// compared with what is left (`size > n - i`, never `i + size > n`).
//
// Reads the size line at p[i, n): its digits, then anything to its LF
// (extensions, the CR). Returns: false, `i` and `size` unchanged, when
// there is no such line there (no digit, over 16, or no LF before `n`);
// else the chunk's size, `i` just past the LF.
bool read_chunk_size_line(const char* p, size_t n, size_t& i, uint64_t& size) noexcept;

struct whole_chunks {
  uint64_t payload = 0;  // the data bytes of the whole chunks counted
  size_t end = 0;        // just past the last one (past the terminal chunk's line when `last`)
  bool last = false;     // the terminal chunk (size 0) ended the walk
};
// Walks the whole chunks at the front of p[0, n), to the terminal chunk or
// to the first thing that is not a whole chunk (a cut chunk, a malformed
// line). Returns: their payload and where they end.
whole_chunks scan_whole_chunks(const char* p, size_t n) noexcept;

namespace detail {
// Whether p[0, 2) is CR LF, as one 16-bit load (little-endian or not: the
// same bytes).
inline bool is_crlf(const char* p) noexcept {
  uint16_t v, want;
  std::memcpy(&v, p, 2);
  std::memcpy(&want, "\r\n", 2);
  return v == want;
}
}  // namespace detail

// One whole chunk at data[i, len), read as the walker reads an event
// stream's: "<hex>CRLF<data>CRLF", 1 to 16 hex digits, a size above 0, all
// of it before `len` (compared as `size > len - at - 2`, never wrapping).
// The last chunk, an extension, a chunk cut by `len` or anything malformed
// is not one. Returns: false, or the data's offset `at` and its `size` (the
// chunk ends at at + size + 2). The limits are the caller's.
inline bool whole_chunk_at(const char* data, size_t len, size_t i, size_t& at, uint64_t& size) noexcept {
  const auto crlf = detail::is_crlf;
  const auto hex = [data](size_t k) noexcept { return k_hex_value[static_cast<unsigned char>(data[k])]; };
  size_t j = i;
  uint64_t n = 0;
  bool more = true;  // the size may go on past j
  if (len - i >= 3) {
    // An event's chunk has two or three digits: read without the loop's
    // bound (three bytes are there), the loop only past three.
    const uint64_t d0 = hex(i), d1 = hex(i + 1);
    if (d0 >= 16) return false;
    if (d1 >= 16) {
      n = d0;
      j = i + 1;
      more = false;
    } else if (const uint64_t d2 = hex(i + 2); d2 >= 16) {
      n = d0 << 4 | d1;
      j = i + 2;
      more = false;
    } else {
      n = d0 << 8 | d1 << 4 | d2;
      j = i + 3;
    }
  }
  if (more) {
    const size_t digits_end = len - i < 16 ? len : i + 16;  // at most 16 hex digits
    for (unsigned d; j < digits_end && (d = hex(j)) < 16; ++j) n = n << 4 | d;
  }
  if (n == 0 || len - j < 2 || !crlf(data + j)) return false;
  const size_t a = j + 2;
  if (len - a < 2 || n > len - a - 2 || !crlf(data + a + n)) return false;
  at = a;
  size = n;
  return true;
}

class chunk_walker {
 public:
  explicit chunk_walker(const chunk_limits& l = {}) noexcept : _limits(l) {}
  void set_limits(const chunk_limits& l) noexcept { _limits = l; }
  void reset() noexcept;
  bool done() const noexcept { return _state == state::done; }
  chunk_error error() const noexcept { return _error; }

  // walk()'s `run` that takes nothing.
  struct no_run {
    size_t operator()(size_t i, uint64_t&, uint64_t&) const noexcept { return i; }
  };
  // Walks `len` bytes at `data`, the next ones of the body. Each piece of
  // payload is passed to on_data(offset, n): offset into `data`, n > 0, in
  // order; each chunk that ends (its data and CRLF) to on_chunk_end(offset
  // just past its CRLF), after its last piece. Stops at the end of the
  // message (bytes after it are left) or at the first error.
  // A chunk whole in this call (an event stream's usual one) goes to
  // on_whole(offset, n, end offset) instead, one call for both.
  //
  // `run(i, body_left, framing_left)`, called where a whole chunk may start
  // at data[i], may take a run of whole chunks there itself (each read by
  // whole_chunk_at, its bytes taken off the two counts of what the limits
  // leave, none handed to on_whole): it returns where the run ended, or i.
  template <class OnData, class OnChunkEnd, class OnWhole, class Run = no_run>
  chunk_step walk(const char* data, size_t len, OnData&& on_data, OnChunkEnd&& on_chunk_end,
                  OnWhole&& on_whole, Run&& run = Run{}) noexcept;

  template <class OnData, class OnChunkEnd>
  chunk_step walk(const char* data, size_t len, OnData&& on_data, OnChunkEnd&& on_chunk_end) noexcept {
    return walk(data, len, on_data, on_chunk_end, [&](size_t at, size_t n, size_t end) noexcept {
      on_data(at, n);
      on_chunk_end(end);
    });
  }
  template <class OnData>
  chunk_step walk(const char* data, size_t len, OnData&& on_data) noexcept {
    return walk(data, len, on_data, [](size_t) noexcept {});
  }

 private:
  enum class state : uint8_t {
    size_first, size, size_ws, ext, size_lf, data, data_cr, data_lf,
    trailer_start, trailer_name, trailer_value, trailer_lf, end_lf, done,
  };
  // One framing byte (anything but payload). Returns: false on an error (set).
  bool framing_byte(unsigned char c) noexcept;
  // After a chunk's CRLF: the next size line starts.
  void next_chunk() noexcept {
    _state = state::size_first;
    _size = 0;
    _digits = 0;
    _ext_bytes = 0;
  }
  bool fail(chunk_error e) noexcept {
    _error = e;
    return false;
  }

  chunk_limits _limits;
  state _state = state::size_first;
  chunk_error _error = chunk_error::none;
  uint8_t _digits = 0;
  uint16_t _trailer_fields = 0;
  uint32_t _ext_bytes = 0;
  uint32_t _trailer_bytes = 0;
  uint64_t _size = 0;          // the size being read, then the bytes left in the chunk
  uint64_t _body_total = 0;
  uint64_t _framing_bytes = 0;
};

template <class OnData, class OnChunkEnd, class OnWhole, class Run>
chunk_step chunk_walker::walk(const char* data, size_t len, OnData&& on_data, OnChunkEnd&& on_chunk_end,
                              OnWhole&& on_whole, Run&& run) noexcept {
  chunk_step st;
  if (_error != chunk_error::none) {
    st.error = _error;
    return st;
  }
  if (_state == state::done) {
    st.done = true;
    return st;
  }
  size_t i = 0;
  if (_state == state::size_first) {
    // Whole chunks -- "<hex>CRLF<data>CRLF" all in this call, as an event
    // stream's are (one event per chunk) -- one per turn, the walker's
    // counters kept in locals across on_data (an opaque call would make
    // every member a reload and a store) and written back once. Anything
    // else (a chunk cut by the read, the last chunk, extensions, an error)
    // stops this loop where that chunk starts, for the general loop below.
    // What the limits leave, in locals: on_whole is opaque to the compiler,
    // so members would be loaded again after every call.
    const auto left = [](uint64_t max, uint64_t used) noexcept { return used < max ? max - used : 0; };
    const uint64_t body_left0 = left(_limits.body_bytes_max, _body_total);
    const uint64_t framing_left0 = left(_limits.framing_bytes_max, _framing_bytes);
    uint64_t body_left = body_left0, framing_left = framing_left0;
    while (true) {
      if (const size_t to = run(i, body_left, framing_left); to != i) {
        i = to;
        st.chunk_end = i;
      }
      size_t at;
      uint64_t size;
      if (!whole_chunk_at(data, len, i, at, size)) break;
      const uint64_t frame = at - i + 2;
      if (size > body_left || frame > framing_left) break;
      body_left -= size;
      framing_left -= frame;
      i = at + static_cast<size_t>(size) + 2;
      st.chunk_end = i;
      on_whole(at, static_cast<size_t>(size), i);
    }
    _body_total += body_left0 - body_left;
    _framing_bytes += framing_left0 - framing_left;
  }
  while (i < len) {
    if (_state == state::size_first) {
      // The common size line, "<hex>CRLF" whole in this call: read at once.
      size_t j = i;
      uint64_t size = 0;
      while (j < len && j - i < 16 && k_hex_value[static_cast<unsigned char>(data[j])] < 16) {
        size = size << 4 | k_hex_value[static_cast<unsigned char>(data[j])];
        ++j;
      }
      if (size != 0 && j + 1 < len && data[j] == '\r' && data[j + 1] == '\n' &&
          size <= _limits.body_bytes_max - _body_total &&
          _framing_bytes + (j + 2 - i) <= _limits.framing_bytes_max) {
        _framing_bytes += j + 2 - i;
        _body_total += size;
        _size = size;
        _state = state::data;
        i = j + 2;
        continue;
      }
      // Anything else (the last chunk, extensions, a line cut by the read,
      // an error) byte by byte.
    }
    if (_state == state::data_cr && len - i >= 2 && data[i] == '\r' && data[i + 1] == '\n' &&
        _framing_bytes + 2 <= _limits.framing_bytes_max) {
      // The CRLF after a chunk's data, whole in this call.
      i += 2;
      _framing_bytes += 2;
      next_chunk();
      st.chunk_end = i;
      on_chunk_end(i);
      continue;
    }
    if (_state == state::data) {
      // The payload: the one part that is not walked byte by byte.
      const size_t n = _size < len - i ? static_cast<size_t>(_size) : len - i;
      on_data(i, n);
      i += n;
      _size -= n;
      if (_size == 0) _state = state::data_cr;
      continue;
    }
    if (_state == state::data_lf && data[i] == '\n') {
      // The common end of a chunk, kept off the general path.
      ++i;
      next_chunk();
      st.chunk_end = i;
      on_chunk_end(i);
      if (++_framing_bytes > _limits.framing_bytes_max) {
        fail(chunk_error::framing_too_large);
        st.consumed = i;
        st.error = _error;
        return st;
      }
      continue;
    }
    if (!framing_byte(static_cast<unsigned char>(data[i++]))) {
      st.consumed = i;
      st.error = _error;
      st.chunk_end = st.chunk_end < i ? st.chunk_end : i;
      return st;
    }
    if (_state == state::done) {
      st.consumed = i;
      st.done = true;
      st.chunk_end = i;
      return st;
    }
  }
  st.consumed = i;
  return st;
}

}  // namespace sluice::http
