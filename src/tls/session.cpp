// tls::session: one SSL on a BIO pair. OpenSSL's BIO pair is two fixed-size
// rings allocated once (at BIO_make_bio_pair): data written never moves and
// the read side hands out pointers into the ring (BIO_nread0 / BIO_nread),
// which is what lets pending_output() be sent by io_uring without a copy and
// without the bytes shifting under the kernel. A BIO_s_mem would grow by
// realloc and move them.
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "sluice/core/assert.hpp"
#include "sluice/tls/tls.hpp"

namespace sluice::tls {

namespace {

// OpenSSL's I/O calls want the thread's error queue empty (SSL_get_error
// reads it). Every failure path here drains what it queued, so the queue
// is empty on entry nearly always: peeking is a load, clearing rewrites all
// sixteen slots of the queue, and both run for every record.
inline void empty_error_queue() noexcept {
  if (ERR_peek_error() != 0) ERR_clear_error();
}

}  // namespace

namespace {

// Space a record adds to its plaintext with the suites the context allows
// (all AEAD): TLS 1.2 5 header + 8 explicit nonce + 16 tag; TLS 1.3 5 + 1
// inner type + 16 tag. Rounded up. Used to stop before OpenSSL would build a
// record the ring cannot take; should it happen anyway, the retry rule of
// write() covers it.
constexpr size_t k_record_overhead_max = 64;
constexpr size_t k_record_plaintext_max = 16384;

}  // namespace

std::string_view to_string(status s) noexcept {
  switch (s) {
    case status::ok: return "ok";
    case status::want_read: return "want_read";
    case status::want_write: return "want_write";
    case status::closed: return "closed";
    case status::error: return "error";
  }
  return "?";
}

session::session(const context& ctx) {
  const context_options& o = ctx.options();
  _ssl = SSL_new(ctx.native_handle());  // takes a reference on the SSL_CTX
  BIO* internal = nullptr;
  // writebuf1: what SSL writes (our output); writebuf2: what we feed (its input).
  if (_ssl == nullptr || BIO_new_bio_pair(&internal, o.output_buffer_bytes, &_network, o.input_buffer_bytes) != 1) {
    // Out of memory making a connection: fail it, not the process.
    if (_ssl != nullptr) SSL_free(_ssl);
    _ssl = nullptr;
    _network = nullptr;
    fail("cannot allocate a TLS session");
    ERR_clear_error();
    return;
  }
  SSL_set_bio(_ssl, internal, internal);  // SSL owns `internal`
  SSL_set_accept_state(_ssl);
  SSL_set_app_data(_ssl, this);
  SSL_set_info_callback(_ssl, on_info);
}

session::~session() { release(); }

void session::release() noexcept {
  if (_ssl != nullptr) SSL_free(_ssl);
  if (_network != nullptr) BIO_free(_network);
  _ssl = nullptr;
  _network = nullptr;
}

session::session(session&& other) noexcept
    : _ssl(std::exchange(other._ssl, nullptr)),
      _network(std::exchange(other._network, nullptr)),
      _failed(other._failed),
      _renegotiation_refused(other._renegotiation_refused),
      _reason_len(other._reason_len) {
  std::memcpy(_reason, other._reason, sizeof _reason);
  if (_ssl != nullptr) SSL_set_app_data(_ssl, this);
}

session& session::operator=(session&& other) noexcept {
  if (this == &other) return *this;
  release();
  _ssl = std::exchange(other._ssl, nullptr);
  _network = std::exchange(other._network, nullptr);
  _failed = other._failed;
  _renegotiation_refused = other._renegotiation_refused;
  _reason_len = other._reason_len;
  std::memcpy(_reason, other._reason, sizeof _reason);
  if (_ssl != nullptr) SSL_set_app_data(_ssl, this);
  return *this;
}

// OpenSSL with SSL_OP_NO_RENEGOTIATION answers a TLS 1.2 client's
// renegotiating ClientHello with a warning no_renegotiation alert and would
// carry on. A client that tries is either broken or probing (renegotiation
// floods cost the server a handshake each), so read() treats it as fatal.
void session::on_info(const ssl_st* ssl, int where, int value) {
  if ((where & SSL_CB_WRITE_ALERT) == 0 || (value & 0xff) != SSL_AD_NO_RENEGOTIATION) return;
  auto* self = static_cast<session*>(SSL_get_app_data(ssl));
  if (self != nullptr) self->_renegotiation_refused = true;
}

status session::fail(std::string_view why) noexcept {
  _failed = true;
  size_t n = std::min(why.size(), sizeof _reason);
  std::memcpy(_reason, why.data(), n);
  _reason_len = static_cast<uint16_t>(n);
  return status::error;
}

// Maps SSL_get_error. Returns: want_read / want_write, closed on
// close_notify, error (with the reason) on anything else.
status session::fail_openssl(int ssl_result, std::string_view during) noexcept {
  switch (SSL_get_error(_ssl, ssl_result)) {
    case SSL_ERROR_WANT_READ: return status::want_read;
    case SSL_ERROR_WANT_WRITE: return status::want_write;
    case SSL_ERROR_ZERO_RETURN: return status::closed;
    case SSL_ERROR_SSL: {
      char line[160] = "no reason queued";
      if (unsigned long e = ERR_get_error(); e != 0) ERR_error_string_n(e, line, sizeof line);
      ERR_clear_error();
      char why[sizeof _reason];
      int n = std::snprintf(why, sizeof why, "%.*s: %s", static_cast<int>(during.size()), during.data(), line);
      return fail(std::string_view(why, n > 0 ? std::min<size_t>(static_cast<size_t>(n), sizeof why - 1) : 0));
    }
    case SSL_ERROR_SYSCALL:
      // A BIO pair never fails a system call; this is its end-of-file,
      // which the codec never signals. Treat it as a protocol failure.
      ERR_clear_error();
      return fail("unexpected end of the TLS stream");
    default:
      ERR_clear_error();
      return fail("unexpected OpenSSL state");
  }
}

status session::feed(std::span<const char> ciphertext) {
  if (_failed || _ssl == nullptr) return status::error;
  if (ciphertext.empty()) return status::ok;
  if (ciphertext.size() > input_space()) {
    char why[96];
    int n = std::snprintf(why, sizeof why, "tls input cap exceeded: %zu bytes fed, %zu free", ciphertext.size(),
                          input_space());
    return fail(std::string_view(why, n > 0 ? static_cast<size_t>(n) : 0));
  }
  // Fits (checked above), so one BIO_write takes it all, wrapping the ring.
  int n = BIO_write(_network, ciphertext.data(), static_cast<int>(ciphertext.size()));
  SLUICE_VERIFY(n == static_cast<int>(ciphertext.size()));
  return status::ok;
}

size_t session::input_space() const noexcept {
  return _network == nullptr ? 0 : BIO_ctrl_get_write_guarantee(_network);
}

status session::handshake() {
  if (_failed || _ssl == nullptr) return status::error;
  if (SSL_is_init_finished(_ssl)) return status::ok;
  empty_error_queue();
  int rc = SSL_do_handshake(_ssl);
  if (rc == 1) return status::ok;
  return fail_openssl(rc, "handshake");
}

bool session::handshake_done() const noexcept { return _ssl != nullptr && SSL_is_init_finished(_ssl); }

bool session::may_read_more() const noexcept {
  // SSL_has_pending: a record (or its plaintext) already inside OpenSSL;
  // else the ciphertext fed and not yet taken. Without either, read()
  // could only answer want_read.
  return _ssl != nullptr && (SSL_has_pending(_ssl) == 1 || BIO_ctrl_pending(SSL_get_rbio(_ssl)) != 0);
}

io_result session::read(std::span<char> out) {
  if (_failed || _ssl == nullptr) return {status::error, 0};
  if (out.empty()) return {status::ok, 0};
  empty_error_queue();
  size_t n = 0;
  int rc = SSL_read_ex(_ssl, out.data(), out.size(), &n);
  if (_renegotiation_refused) return {fail("client renegotiation attempt (refused)"), 0};
  if (rc == 1) return {status::ok, n};
  return {fail_openssl(rc, "read"), 0};
}

io_result session::write(std::span<const char> in) {
  if (_failed || _ssl == nullptr) return {status::error, 0};
  size_t done = 0;
  while (done < in.size()) {
    // The ring's free space, so SSL_write never builds a record it cannot
    // hand over whole (SSL_write writes one record per call: partial mode).
    size_t space = BIO_ctrl_get_write_guarantee(SSL_get_wbio(_ssl));
    if (space <= k_record_overhead_max) return {status::want_write, done};
    size_t chunk = std::min({in.size() - done, k_record_plaintext_max, space - k_record_overhead_max});
    empty_error_queue();
    size_t n = 0;
    int rc = SSL_write_ex(_ssl, in.data() + done, chunk, &n);
    if (rc != 1) return {fail_openssl(rc, "write"), done};
    done += n;
  }
  return {status::ok, done};
}

status session::shutdown() {
  if (_failed || _ssl == nullptr || !SSL_is_init_finished(_ssl)) return status::closed;
  empty_error_queue();
  int rc = SSL_shutdown(_ssl);
  // 0: close_notify sent, the peer's not seen (nor waited for: the codec
  // closes after sending). 1: both seen.
  if (rc >= 0) return status::ok;
  status st = fail_openssl(rc, "shutdown");
  return st == status::want_write ? st : status::closed;
}

std::span<const char> session::pending_output() const noexcept {
  if (_network == nullptr) return {};
  char* p = nullptr;
  int n = BIO_nread0(_network, &p);
  if (n <= 0 || p == nullptr) return {};
  return {p, static_cast<size_t>(n)};
}

size_t session::output_size() const noexcept { return _network == nullptr ? 0 : BIO_ctrl_pending(_network); }

void session::consume_output(size_t n) noexcept {
  if (n == 0) return;
  SLUICE_ASSERT(n <= pending_output().size());
  char* p = nullptr;
  int got = BIO_nread(_network, &p, static_cast<int>(n));
  SLUICE_VERIFY(got == static_cast<int>(n));
}

application_protocol session::alpn() const noexcept {
  const unsigned char* p = nullptr;
  unsigned len = 0;
  if (_ssl != nullptr) SSL_get0_alpn_selected(_ssl, &p, &len);
  return len == 2 && p[0] == 'h' && p[1] == '2' ? application_protocol::h2 : application_protocol::http1_1;
}

bool session::alpn_negotiated() const noexcept {
  const unsigned char* p = nullptr;
  unsigned len = 0;
  if (_ssl != nullptr) SSL_get0_alpn_selected(_ssl, &p, &len);
  return len != 0;
}

std::string_view session::server_name() const noexcept {
  const char* name = _ssl != nullptr ? SSL_get_servername(_ssl, TLSEXT_NAMETYPE_host_name) : nullptr;
  return name != nullptr ? std::string_view(name) : std::string_view();
}

std::string_view session::version_name() const noexcept {
  return _ssl != nullptr ? std::string_view(SSL_get_version(_ssl)) : std::string_view();
}

std::string_view session::cipher_name() const noexcept {
  const SSL_CIPHER* c = _ssl != nullptr ? SSL_get_current_cipher(_ssl) : nullptr;
  return c != nullptr ? std::string_view(SSL_CIPHER_get_name(c)) : std::string_view();
}

bool session::resumed() const noexcept { return _ssl != nullptr && SSL_session_reused(_ssl) == 1; }

}  // namespace sluice::tls
