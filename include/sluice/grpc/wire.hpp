#pragma once
// grpc: the two byte layers under a gRPC message, both pure. The 5-byte
// length-prefixed message framing of gRPC over HTTP/2 (PROTOCOL-HTTP2.md:
// a compressed flag, then a big-endian uint32 length), and the protobuf wire
// format (varints, tags, length-delimited fields) that kserve.hpp builds its
// messages from. No allocation: the writer fills a caller's buffer, the
// reader hands out views into its input.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace sluice::grpc {

// Why a decode stopped. Bytes from a backend are never asserted on: each
// malformed shape is a value the adapter maps to a 502.
enum class decode_status : uint8_t {
  ok,
  need_more,         // frame: fewer bytes than the header or its length says
  truncated,         // protobuf: a field runs past the end of its message
  over_long,         // protobuf: a length past its enclosing message / frame: past the cap
  bad_varint,        // more than 10 bytes, or a tag past 32 bits
  bad_wire_type,     // wire type 6 or 7, field number 0, or an unmatched group end
  compressed,        // frame: compressed flag set; sluice asks for no compression
  bad_frame_flag,    // frame: flag byte other than 0 or 1
  bad_tensor,        // kserve: a BYTES element or a number shorter than it says
};

// A sentence for logs and the 502's message.
std::string_view describe(decode_status s) noexcept;

// --- gRPC message framing ---------------------------------------------------

inline constexpr size_t k_frame_header_bytes = 5;

// Writes the 5-byte prefix of an uncompressed message of `message_bytes`.
void write_frame_header(char* out, uint32_t message_bytes) noexcept;

struct frame {
  std::string_view message;  // the protobuf bytes, a view into the input
  size_t consumed = 0;       // header + message: where the next frame starts
};

// Reads one frame from the front of `in`. Returns: ok with `out` set;
// need_more while `in` holds less than the whole frame (at end of stream
// that is a truncated frame); over_long when the declared length passes
// `message_bytes_max` (refused before waiting for the bytes); compressed
// or bad_frame_flag for a flag sluice never negotiated.
decode_status read_frame(std::string_view in, uint32_t message_bytes_max, frame& out) noexcept;

// --- protobuf wire format ---------------------------------------------------

enum class wire_type : uint8_t {
  varint = 0, fixed64 = 1, len = 2, group_start = 3, group_end = 4, fixed32 = 5,
};

constexpr size_t varint_bytes(uint64_t v) noexcept {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}
constexpr size_t tag_bytes(uint32_t field) noexcept { return varint_bytes(uint64_t{field} << 3); }
// A length-delimited field holding `len` bytes, tag included.
constexpr size_t len_field_bytes(uint32_t field, size_t len) noexcept {
  return tag_bytes(field) + varint_bytes(len) + len;
}

// Stack-only, one per message being encoded. Every put checks room; after
// the first miss ok() stays false and nothing more is written (the caller
// sized the buffer from the same size functions, so a miss is a bug there).
class wire_writer {
 public:
  wire_writer(char* begin, size_t cap) noexcept : _begin(begin), _p(begin), _end(begin + cap) {}

  void varint(uint64_t v) noexcept;
  void tag(uint32_t field, wire_type t) noexcept { varint((uint64_t{field} << 3) | uint64_t(t)); }
  void raw(std::string_view bytes) noexcept;
  void fixed32_le(uint32_t v) noexcept;
  // Tag, then the length of a nested message or bytes whose body follows.
  void len_prefix(uint32_t field, size_t len) noexcept {
    tag(field, wire_type::len);
    varint(len);
  }
  void bytes_field(uint32_t field, std::string_view bytes) noexcept {
    len_prefix(field, bytes.size());
    raw(bytes);
  }
  void varint_field(uint32_t field, uint64_t v) noexcept {
    tag(field, wire_type::varint);
    varint(v);
  }

  bool ok() const noexcept { return _ok; }
  size_t written() const noexcept { return static_cast<size_t>(_p - _begin); }

 private:
  char* _begin;
  char* _p;
  char* _end;
  bool _ok = true;
};

// One field as read from the wire. For len, `bytes` views its body; for
// varint/fixed*, `value` holds the number (fixed32/fixed64 little-endian).
struct wire_field {
  uint32_t number = 0;
  wire_type type = wire_type::varint;
  uint64_t value = 0;
  std::string_view bytes;
  // The key as read (number << 3 | type): one compare tells a field by
  // number and type (see is(); two narrow stores read back as one wide
  // load would stall on store forwarding).
  uint32_t key = 0;
  bool is(uint32_t field, wire_type t) const noexcept { return key == (field << 3 | uint32_t(t)); }
};

// Stack-only: walks one message's fields in wire order. Groups (wire types
// 3/4, deprecated but legal) are skipped whole by next(), so a caller sees
// only the other types.
class wire_reader {
 public:
  explicit wire_reader(std::string_view message) noexcept
      : _p(message.data()), _end(message.data() + message.size()) {}

  // Returns: true with `f` set; false at the end (status() ok) or on
  // malformed input (status() says what).
  bool next(wire_field& f) noexcept;
  decode_status status() const noexcept { return _status; }
  // Where the next field starts.
  const char* pos() const noexcept { return _p; }

 private:
  bool read_varint(uint64_t& v) noexcept;
  bool read_one(wire_field& f) noexcept;
  bool skip_group(uint32_t number) noexcept;
  bool fail(decode_status s) noexcept {
    _status = s;
    _p = _end;
    return false;
  }

  const char* _p;
  const char* _end;
  decode_status _status = decode_status::ok;
};

// --- wire_reader, inline: the per-message decode of a stream runs these
// a dozen times per token.

inline bool wire_reader::read_varint(uint64_t& v) noexcept {
  // One byte: nearly every tag and length of a token's message.
  if (_p != _end && (static_cast<unsigned char>(*_p) & 0x80) == 0) {
    v = static_cast<unsigned char>(*_p++);
    return true;
  }
  v = 0;
  // At most 10 bytes carry 64 bits; a longer run is malformed, not big.
  for (unsigned shift = 0; shift < 70; shift += 7) {
    if (_p == _end) return fail(decode_status::truncated);
    const auto b = static_cast<unsigned char>(*_p++);
    v |= uint64_t{b & 0x7Fu} << shift;
    if ((b & 0x80) == 0) return true;
  }
  return fail(decode_status::bad_varint);
}

inline bool wire_reader::read_one(wire_field& f) noexcept {
  uint64_t key = 0;
  if (!read_varint(key)) return false;
  if (key >> 32 != 0) return fail(decode_status::bad_varint);
  f.key = static_cast<uint32_t>(key);
  f.number = static_cast<uint32_t>(key >> 3);
  const auto t = static_cast<uint8_t>(key & 7);
  if (f.number == 0 || t > 5) return fail(decode_status::bad_wire_type);
  f.type = static_cast<wire_type>(t);
  f.value = 0;
  f.bytes = {};
  const auto left = static_cast<size_t>(_end - _p);
  switch (f.type) {
    case wire_type::varint:
      return read_varint(f.value);
    case wire_type::fixed64:
    case wire_type::fixed32: {
      const size_t n = f.type == wire_type::fixed64 ? 8 : 4;
      if (left < n) return fail(decode_status::truncated);
      for (size_t i = 0; i < n; ++i) {
        f.value |= uint64_t{static_cast<unsigned char>(_p[i])} << (8 * i);
      }
      _p += n;
      return true;
    }
    case wire_type::len: {
      uint64_t len = 0;
      if (!read_varint(len)) return false;
      // A length past the message's end: the field claims bytes that belong
      // to the enclosing message (or to no message at all).
      if (len > static_cast<uint64_t>(_end - _p)) return fail(decode_status::over_long);
      f.bytes = std::string_view(_p, static_cast<size_t>(len));
      _p += len;
      return true;
    }
    case wire_type::group_start:
    case wire_type::group_end:
      return true;
  }
  return fail(decode_status::bad_wire_type);
}

inline bool wire_reader::next(wire_field& f) noexcept {
  for (;;) {
    if (_p == _end) return false;
    if (!read_one(f)) return false;
    if (f.type == wire_type::group_end) return fail(decode_status::bad_wire_type);
    if (f.type != wire_type::group_start) return true;
    if (!skip_group(f.number)) return false;
  }
}

}  // namespace sluice::grpc
