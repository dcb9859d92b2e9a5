#pragma once
// tls: TLS termination for the client edge (OpenSSL 3.0), with no I/O of its
// own. A tls::session keeps its SSL on a pair of fixed-size memory rings, so
// the codec that owns the connection does every recv and send through the
// shard's io_uring and OpenSSL never touches the socket:
//
//   recv CQE (ciphertext)  -> session.feed(bytes)       copied in; give the
//                                                        provided buffer back
//                          -> session.handshake() until ok, then
//                             session.read(out) until want_read
//   plaintext to send      -> session.write(bytes)      encrypted into the
//                                                        output ring
//   after ANY call         -> if session.has_output():
//                               v = session.pending_output();
//                               send SQE on v (v stays put, see below)
//   send CQE (res = n > 0) -> session.consume_output(n), then send the rest
//                             and retry a write()/handshake() that said
//                             want_write
//
// Nothing here blocks, sleeps or reads a clock: a client that stops
// mid-handshake leaves handshake() at want_read, and the codec's header
// deadline closes it.
//
// One tls::context per TLS listener snapshot is built on the cold path
// (start-up, SIGHUP) and shared read-only by the shards; each session keeps
// its context's SSL_CTX alive through OpenSSL's own reference count, so a
// reload builds a new context and connections that started on the old one
// finish on it.
//
// Memory: a session allocates when it is made (the SSL, both rings) and
// OpenSSL allocates its record buffers on the first record and keeps them
// (SSL_MODE_RELEASE_BUFFERS stays off: it would free and reallocate them
// per record). After that, feed/read/write/send allocate nothing of ours.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

// OpenSSL's types, so that includers need not see <openssl/ssl.h>.
struct ssl_ctx_st;
struct ssl_st;
struct bio_st;

namespace sluice::tls {

enum class version : uint8_t { tls1_2, tls1_3 };

// Returns: the version for config text "1.2" or "1.3"; nullopt otherwise.
std::optional<version> parse_version(std::string_view text) noexcept;

struct context_options {
  std::string cert_path;   // PEM: the leaf certificate first, then its intermediates
  std::string key_path;    // PEM private key, unencrypted (no pass phrase prompt on a server)
  version min_version = version::tls1_2;
  bool h2 = true;          // offer h2 in ALPN; false = http/1.1 only (a codec without h2)
  // SSL_OP_ENABLE_KTLS. OpenSSL 3.0 turns kTLS on only for an SSL whose BIO
  // is a socket; a session on memory rings never gets it (see ktls_fit).
  bool ktls = false;
  // Per-session caps. Input: ciphertext fed but not yet taken by OpenSSL;
  // must be at least the largest recv the codec feeds at once. Output:
  // ciphertext waiting for consume_output. Each session allocates both rings
  // once, when it is made.
  size_t input_buffer_bytes = 32u << 10;
  size_t output_buffer_bytes = 32u << 10;
};

// Cold path only: a context that cannot be built throws this, and the
// message names the file and OpenSSL's reason. It never holds key bytes.
struct context_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ticket_keyring;  // src/tls/context.cpp

// Shared, one per TLS listener snapshot; built on the control thread (or in
// main) and read by every shard: nothing sets its SSL_CTX after load()
// (SSL_new from several threads at once is safe on a settled SSL_CTX). Lives until the last session made from it
// is gone (sessions hold its SSL_CTX, not this object).
//
// Session tickets are stateless (no server-side session cache): each ticket
// is sealed with AES-256-CBC + HMAC-SHA256 under a key held in memory only.
// There is a current key (seals new tickets, opens its own) and a previous
// one (still opens; the client then gets a fresh ticket under the current
// key). rotate_ticket_keys() shifts current to previous and makes a new
// current, so a ticket survives one rotation and not two. TLS 1.3 early data
// (0-RTT) stays off: no replay window.
class context {
 public:
  // Builds a server context from the PEM files: TLS 1.2 (ECDHE with AES-GCM
  // or ChaCha20-Poly1305) or 1.3, min_version and up; renegotiation refused;
  // compression off; ALPN h2 then http/1.1 by the server's preference.
  // `previous`: the context this one replaces at a reload; its ticket keys
  // are carried over so clients resume across the reload. Throws
  // context_error.
  static std::shared_ptr<context> load(const context_options& options, const context* previous = nullptr);

  ~context();
  context(const context&) = delete;
  context& operator=(const context&) = delete;

  // Thread-safe: the control thread may call it while shards handshake (the
  // keys sit behind a mutex taken once per ticket sealed or opened, that
  // is once per full or resumed handshake, never per record).
  void rotate_ticket_keys();

  const context_options& options() const noexcept { return _options; }
  ssl_ctx_st* native_handle() const noexcept { return _ctx; }

 private:
  context() = default;
  context_options _options;
  ssl_ctx_st* _ctx = nullptr;
  ticket_keyring* _keys = nullptr;  // owned by _ctx (freed with it)
};

enum class status : uint8_t {
  ok,          // done: the handshake finished / bytes were read or written
  want_read,   // needs more ciphertext: feed() and call again
  want_write,  // the output ring is full: send pending_output(), consume_output(), call again
  closed,      // the peer sent close_notify (read), or nothing to send (shutdown)
  error,       // fatal; reason() says why. Send what pending_output() holds (an alert), then close
};

std::string_view to_string(status s) noexcept;

struct io_result {
  status st;
  size_t bytes;  // plaintext read into `out`, or taken from `in`
};

enum class application_protocol : uint8_t { http1_1, h2 };

// Shard-local, one per downstream TLS connection: from accept until the
// socket is closed. Move-only (a moved-from session answers error);
// nothing in it is shared with another shard.
//
// Output lifetime, for io_uring: pending_output() views bytes inside the
// session's output ring. Those bytes do not move and are not overwritten
// until consume_output() releases them: later write(), read(), handshake()
// or shutdown() calls only append behind them. So a send SQE may point at
// the view until its CQE arrives, as long as the session itself stays
// alive (and is not moved) meanwhile. Keep one send in flight: until
// consume_output(), pending_output() shows the same bytes again.
class session {
 public:
  explicit session(const context& ctx);
  ~session();
  session(session&& other) noexcept;
  session& operator=(session&& other) noexcept;
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  // Copies ciphertext received from the client into the input ring.
  // Returns: ok; or error when it does not fit (more than
  // input_buffer_bytes would be waiting: the caller must read() before
  // feeding more), or after an earlier error.
  status feed(std::span<const char> ciphertext);
  size_t input_space() const noexcept;  // how much feed() takes now

  // Returns: ok once the handshake is done (and on every call after);
  // want_read / want_write while it runs; error (e.g. no shared version,
  // an ALPN list without h2 or http/1.1: the client gets its alert).
  status handshake();
  bool handshake_done() const noexcept;

  // Decrypts into `out` (runs the handshake first if it is not done).
  // Returns: {ok, n > 0}; {want_read, 0} when no whole record is buffered;
  // {closed, 0} on the client's close_notify; {error, 0} on bad records,
  // garbage, or a renegotiation attempt (refused with a no_renegotiation
  // alert, then treated as fatal here).
  io_result read(std::span<char> out);
  // Whether read() may give more than want_read now: some of what was fed
  // is not read yet. False: it would only say want_read (feed first).
  bool may_read_more() const noexcept;

  // Encrypts as much of `in` as the output ring takes, one record at a time.
  // Returns: {ok, in.size()}; {want_write, n < in.size()} when the ring is
  // full (send, consume, then call again with the rest -- the same bytes:
  // OpenSSL may already hold a record built from them); {error, n}.
  io_result write(std::span<const char> in);

  // Queues close_notify. Returns: ok when it is in pending_output(); closed
  // when there is nothing to send (the handshake never finished, or after an
  // error): close the socket; want_write when the ring is full.
  status shutdown();

  // Ciphertext to send: the first contiguous piece of the output ring (the
  // ring may wrap: after consume_output() there may be more). Empty when
  // there is nothing to send.
  std::span<const char> pending_output() const noexcept;
  bool has_output() const noexcept { return output_size() != 0; }
  size_t output_size() const noexcept;  // all of it, both pieces
  // Releases the first n bytes of pending_output() after the send of them
  // completed (n <= pending_output().size()).
  void consume_output(size_t n) noexcept;

  // After the handshake: the protocol the codec speaks. http1_1 also when
  // the client offered no ALPN at all (alpn_negotiated() is false then).
  application_protocol alpn() const noexcept;
  bool alpn_negotiated() const noexcept;
  std::string_view server_name() const noexcept;  // SNI, "" when none
  std::string_view version_name() const noexcept; // "TLSv1.3", ...
  std::string_view cipher_name() const noexcept;
  bool resumed() const noexcept;  // the client came back with a ticket

  // Why the last call returned error: OpenSSL's reason or ours, for logs.
  // Never holds plaintext, key bytes or the client's bytes.
  std::string_view reason() const noexcept { return std::string_view(_reason, _reason_len); }
  bool failed() const noexcept { return _failed; }

  ssl_st* native_handle() const noexcept { return _ssl; }

 private:
  status fail(std::string_view why) noexcept;
  status fail_openssl(int ssl_result, std::string_view during) noexcept;
  void release() noexcept;
  static void on_info(const ssl_st* ssl, int where, int value);

  ssl_st* _ssl = nullptr;
  bio_st* _network = nullptr;   // our end of the pair: feed writes it, pending_output reads it
  bool _failed = false;
  bool _renegotiation_refused = false;  // set by on_info when OpenSSL sends no_renegotiation
  uint16_t _reason_len = 0;
  // A fixed buffer, not a std::string: a failing connection allocates nothing.
  char _reason[200] = {};
};

// kTLS (Linux 4.13 send, 4.17 receive, 5.1 TLS 1.3 and AES-256-GCM, 5.11
// ChaCha20-Poly1305) with OpenSSL
// 3.0: OpenSSL itself sets TCP_ULP "tls" and hands the keys to the kernel
// when the cipher state changes, but only for an SSL whose BIO is a socket
// (BIO_get_ktls_send / BIO_get_ktls_recv then say it took). A session on
// memory rings cannot be offloaded afterwards: OpenSSL 3.0 has no public
// call that yields the traffic keys and record sequence numbers the kernel
// needs. A codec that wants kTLS must run the handshake on a socket BIO over
// the non-blocking fd (readiness from IORING_OP_POLL_ADD), with
// context_options::ktls set, and then send plaintext through the ring.
struct ktls_support {
  bool send = false;
  bool recv = false;
};

// Whether the kernel offers kTLS: /proc/net/tls_stat exists (the tls module
// is loaded), or setting TCP_ULP "tls" on a throwaway loopback connection
// succeeds (which loads the module where the kernel may). Cold path: opens
// and closes three sockets. `why` (optional) gets the reason when it is not.
bool ktls_available(std::string* why = nullptr);

// After the handshake: what OpenSSL 3.0 would offload for this version and
// cipher on a socket BIO: TLS 1.2 send and receive, TLS 1.3 send only (3.0
// lacks the TLS 1.3 receive path); AES-128-GCM, AES-256-GCM, and
// ChaCha20-Poly1305 (the last only where OpenSSL was built against kernel
// headers that have it). The kernel's own support is ktls_available().
// Returns: both false before the handshake is done.
ktls_support ktls_fit(const session& s) noexcept;

// Edge detection on a connection's first bytes, so a codec can answer at
// once instead of waiting for a header deadline.
enum class sniff : uint8_t { no, yes, need_more };

// For the plaintext port: a TLS handshake record (0x16, then version 0x03
// 0x00..0x04). need_more while the bytes seen so far fit one.
sniff looks_like_tls_client_hello(std::span<const char> bytes) noexcept;

// For the TLS port: an HTTP request line ("GET ", "POST ", "PRI * ..." of
// HTTP/2 prior knowledge): 1 to 16 upper-case ASCII letters, then a space.
// A TLS record never starts with a letter. need_more while it still could.
sniff looks_like_plain_http(std::span<const char> bytes) noexcept;

// What a codec may send before closing: nginx's answer to HTTP on an HTTPS
// port (a 400 that says so), and a fatal handshake_failure alert for a
// ClientHello on the plaintext port (the client's TLS stack then reports an
// alert instead of "wrong version number").
extern const std::string_view k_plain_http_on_tls_port_response;
extern const std::string_view k_tls_on_plain_port_alert;

}  // namespace sluice::tls
