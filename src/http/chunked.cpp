// The chunked transfer coding's framing, one byte at a time (the payload is
// taken in spans by chunk_walker::walk in the header).
#include "sluice/http/chunked.hpp"

#include "head_scan.hpp"

namespace sluice::http {

namespace {

constexpr uint32_t k_ext_bytes_max = 4096;  // per chunk

bool is_field_ctl(unsigned char c) noexcept { return (c < 0x20 && c != '\t') || c == 0x7f; }

}  // namespace

std::string_view chunk_message(chunk_error e) noexcept {
  switch (e) {
    case chunk_error::none: return "ok";
    case chunk_error::size_too_many_digits: return "chunk size has too many digits";
    case chunk_error::invalid_size: return "invalid chunk size";
    case chunk_error::bare_lf_in_size_line: return "bare LF in chunk size line";
    case chunk_error::bare_lf_in_extension: return "bare LF in chunk extension";
    case chunk_error::ctl_in_extension: return "control character in chunk extension";
    case chunk_error::extension_too_long: return "chunk extension too long";
    case chunk_error::bare_cr_in_size_line: return "bare CR in chunk size line";
    case chunk_error::data_not_followed_by_crlf: return "chunk data not followed by CRLF";
    case chunk_error::body_too_large: return "chunked body too large";
    case chunk_error::framing_too_large: return "chunk framing too large";
    case chunk_error::trailer_too_large: return "trailer section too large";
    case chunk_error::too_many_trailer_fields: return "too many trailer fields";
    case chunk_error::trailer_obs_fold: return "obsolete line folding in trailer section";
    case chunk_error::invalid_trailer_field: return "invalid trailer field";
    case chunk_error::trailer_space_before_colon: return "whitespace between trailer field name and colon";
    case chunk_error::bare_lf_in_trailer: return "bare LF in trailer section";
    case chunk_error::ctl_in_trailer: return "control character in trailer field";
    case chunk_error::bare_cr_in_trailer: return "bare CR in trailer section";
    case chunk_error::bare_cr_after_last_chunk: return "bare CR after the last chunk";
  }
  return "malformed chunked body";
}

bool read_chunk_size_line(const char* p, size_t n, size_t& i, uint64_t& size) noexcept {
  size_t j = i;
  uint64_t v = 0;
  while (j < n && j - i < 17 && k_hex_value[static_cast<unsigned char>(p[j])] < 16) {
    v = v << 4 | k_hex_value[static_cast<unsigned char>(p[j])];
    ++j;
  }
  if (j == i || j - i > 16) return false;
  while (j < n && p[j] != '\n') ++j;
  if (j == n) return false;
  i = j + 1;
  size = v;
  return true;
}

whole_chunks scan_whole_chunks(const char* p, size_t n) noexcept {
  whole_chunks w;
  size_t i = 0;
  uint64_t size = 0;
  while (i < n && read_chunk_size_line(p, n, i, size)) {
    if (size == 0) {
      w.last = true;
      w.end = i;
      break;
    }
    // The data and its CRLF must lie whole before n.
    if (size > n - i || n - i - size < 2 || p[i + size] != '\r' || p[i + size + 1] != '\n') break;
    i += static_cast<size_t>(size) + 2;
    w.payload += size;
    w.end = i;
  }
  return w;
}

void chunk_walker::reset() noexcept {
  _state = state::size_first;
  _error = chunk_error::none;
  _digits = 0;
  _trailer_fields = 0;
  _ext_bytes = 0;
  _trailer_bytes = 0;
  _size = 0;
  _body_total = 0;
  _framing_bytes = 0;
}

bool chunk_walker::framing_byte(unsigned char c) noexcept {
  // The trailer section has its own bound.
  if (_state < state::trailer_start && ++_framing_bytes > _limits.framing_bytes_max) {
    return fail(chunk_error::framing_too_large);
  }
  switch (_state) {
    case state::size_first:
    case state::size: {
      const unsigned digit = k_hex_value[c];
      if (digit < 16) {
        // 16 hex digits fill a uint64_t: the value below cannot wrap.
        if (++_digits > 16) return fail(chunk_error::size_too_many_digits);
        _size = (_size << 4) | digit;
        if (_size > _limits.body_bytes_max - _body_total) return fail(chunk_error::body_too_large);
        _state = state::size;
      } else if (_state == state::size_first) {
        return fail(chunk_error::invalid_size);
      } else if (c == '\r') {
        _state = state::size_lf;
      } else if (c == ';') {
        _state = state::ext;
      } else if (c == ' ' || c == '\t') {
        _state = state::size_ws;  // BWS before ';' (RFC 9112 §7.1.1)
      } else if (c == '\n') {
        return fail(chunk_error::bare_lf_in_size_line);
      } else {
        return fail(chunk_error::invalid_size);
      }
      return true;
    }
    case state::size_ws:
      if (c == ';') {
        _state = state::ext;
      } else if (c != ' ' && c != '\t') {
        return fail(chunk_error::invalid_size);
      }
      return true;
    case state::ext:
      // Extensions mean nothing to sluice: skipped, bounded.
      if (c == '\r') {
        _state = state::size_lf;
      } else if (c == '\n') {
        return fail(chunk_error::bare_lf_in_extension);
      } else if (is_field_ctl(c)) {
        return fail(chunk_error::ctl_in_extension);
      } else if (++_ext_bytes > k_ext_bytes_max) {
        return fail(chunk_error::extension_too_long);
      }
      return true;
    case state::size_lf:
      if (c != '\n') return fail(chunk_error::bare_cr_in_size_line);
      if (_size == 0) {
        _state = state::trailer_start;
      } else {
        _body_total += _size;
        _state = state::data;
      }
      return true;
    case state::data_cr:
      if (c != '\r') return fail(chunk_error::data_not_followed_by_crlf);
      _state = state::data_lf;
      return true;
    case state::data_lf:
      if (c != '\n') return fail(chunk_error::data_not_followed_by_crlf);
      next_chunk();
      return true;
    case state::trailer_start:
    case state::trailer_name:
    case state::trailer_value:
    case state::trailer_lf:
      if (++_trailer_bytes > _limits.trailer_bytes_max) return fail(chunk_error::trailer_too_large);
      if (_state == state::trailer_start) {
        if (c == '\r') {
          _state = state::end_lf;
        } else if (c == ' ' || c == '\t') {
          return fail(chunk_error::trailer_obs_fold);
        } else if (!detail::is_tchar(c)) {
          return fail(chunk_error::invalid_trailer_field);
        } else if (++_trailer_fields > _limits.trailer_fields_max) {
          return fail(chunk_error::too_many_trailer_fields);
        } else {
          _state = state::trailer_name;
        }
      } else if (_state == state::trailer_name) {
        if (c == ':') {
          _state = state::trailer_value;
        } else if (c == ' ' || c == '\t') {
          return fail(chunk_error::trailer_space_before_colon);
        } else if (!detail::is_tchar(c)) {
          return fail(chunk_error::invalid_trailer_field);
        }
      } else if (_state == state::trailer_value) {
        if (c == '\r') {
          _state = state::trailer_lf;
        } else if (c == '\n') {
          return fail(chunk_error::bare_lf_in_trailer);
        } else if (is_field_ctl(c)) {
          return fail(chunk_error::ctl_in_trailer);
        }
      } else {
        if (c != '\n') return fail(chunk_error::bare_cr_in_trailer);
        _state = state::trailer_start;
      }
      return true;
    case state::end_lf:
      if (c != '\n') return fail(chunk_error::bare_cr_after_last_chunk);
      _state = state::done;
      return true;
    case state::data:
    case state::done: break;  // handled by walk()
  }
  return true;
}

}  // namespace sluice::http
