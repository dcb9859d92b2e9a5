#pragma once
// The triton adapter between the adapters' fakes (adapter_fixture.hpp: the
// fake codec and policy, the loopback listeners) and a scripted gRPC
// backend: each connection the listener accepts is answered by an nghttp2
// server session the test drives by hand. The session reads the requests as
// they come; the test answers with HEADERS, gRPC messages, trailers, a
// Trailers-Only HEADERS or RST_STREAM, each flushed to the socket at once,
// and runs the shard's turns until the adapter has handled them.
#include <nghttp2/nghttp2.h>

#include <map>

#include "adapter_fixture.hpp"
#include "triton_grpc.hpp"

namespace sluice::adapters_test {

// One stream as the backend sees it: the request, the answer given so far.
struct grpc_stream {
  int32_t id = 0;
  std::vector<std::pair<std::string, std::string>> fields;  // the request's HEADERS, in order
  std::string body;              // the request's DATA
  bool request_ended = false;    // END_STREAM came
  bool taken = false;            // handed to the test (await_request)
  bool closed = false;           // nghttp2 closed it
  bool reset_by_sluice = false;  // an RST_STREAM came
  uint32_t reset_code = 0;

  // The answer, fed to nghttp2 through a data provider.
  bool head_sent = false;
  std::string out;
  size_t out_sent = 0;
  bool ending = false;    // the trailers follow the last byte of `out`
  bool deferred = false;  // the provider is waiting for more
  std::string status;     // the trailers' grpc-status
  std::string message;    // and grpc-message ("" leaves it out)

  // The value of a request field, or "<absent>" / "<repeated>".
  std::string field(std::string_view name) const;
};

// One accepted connection: an nghttp2 server session over the socket
// scripted_backend holds (the socket is its, closed by it).
class grpc_peer {
 public:
  grpc_peer(scripted_backend& b, size_t conn);
  ~grpc_peer();
  grpc_peer(const grpc_peer&) = delete;
  grpc_peer& operator=(const grpc_peer&) = delete;

  // Takes what came on the socket into the session, then writes what the
  // session has to say. Returns: whether the peer is still there.
  bool service();
  // Whether sluice closed the connection (EOF or a reset seen).
  bool gone() const { return _gone; }
  bool idle() const;  // nothing waits to be written

  grpc_stream& stream(int32_t id) { return streams.at(id); }

  // The answers; each goes to the socket at once.
  void head(int32_t id);  // :status 200, content-type application/grpc
  void message(int32_t id, std::string_view framed);
  void trailers(int32_t id, uint32_t grpc_status, std::string_view grpc_message = {});
  void trailers_only(int32_t id, uint32_t grpc_status, std::string_view grpc_message = {});
  void reset(int32_t id, uint32_t error_code);
  // Plain HTTP/2 HEADERS of another status, with no gRPC in it.
  void http_head(int32_t id, std::string_view status, bool end_stream);

  std::map<int32_t, grpc_stream> streams;
  std::vector<int32_t> order;  // stream ids as their requests began
  scripted_backend& backend;
  size_t conn;

 private:
  int fd() const { return backend.conns[conn]; }
  void flush();
  void submit_head(grpc_stream& s);
  void wake(grpc_stream& s);

  static int on_header(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                       const uint8_t* value, size_t valuelen, uint8_t, void* user);
  static int on_data_chunk(nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len, void* user);
  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* user);
  static int on_stream_close(nghttp2_session*, int32_t id, uint32_t code, void* user);
  static ssize_t read_answer(nghttp2_session*, int32_t id, uint8_t* buf, size_t length, uint32_t* flags,
                             nghttp2_data_source* source, void* user);

  nghttp2_session* _session = nullptr;
  std::string _pending;  // frames the socket has not taken yet
  bool _gone = false;
};

// A request a peer got: the connection it came on and its stream.
struct grpc_request {
  grpc_peer* peer = nullptr;
  int32_t id = 0;
  grpc_stream& stream() const { return peer->stream(id); }
};

// One shard's triton adapter on a config whose `{g0}`, `{g1}` ... stand for
// the scripted backends' grpc:// URLs, in order.
struct triton_shard {
  std::vector<std::unique_ptr<scripted_backend>> backends;
  std::vector<std::unique_ptr<grpc_peer>> peers;  // one per accepted connection, in accept order
  std::shared_ptr<const config::config> config;
  std::unique_ptr<shard::reactor> ring;
  std::unique_ptr<metrics::registry> registry;
  std::unique_ptr<proxy::shard_context> ctx;
  fake_policy policy;
  std::unique_ptr<proxy::triton_grpc> triton;
  openai::request_reader reader{1u << 20};
  std::vector<std::unique_ptr<call>> calls;
  int fds_after_setup = 0;

  explicit triton_shard(std::string_view groups, std::vector<bool> listening = {true});
  ~triton_shard();
  triton_shard(const triton_shard&) = delete;
  triton_shard& operator=(const triton_shard&) = delete;

  scripted_backend& backend(size_t i = 0) { return *backends[i]; }
  uint32_t backend_index(size_t i) const;
  // Connections accepted by backend i so far.
  size_t accepted(size_t i = 0) const { return backends[i]->conns.size(); }

  // A request of `body` made, prepared and started on the triton adapter.
  // Returns: the call (owned by the shard).
  call& start(std::string_view body, const call_options& o = {});

  // The reactor's turns, each after the sends out completed and the peers
  // serviced (new connections accepted, what came read, what they have
  // written), until `cond` holds. Returns: whether it held within the bound.
  template <class Cond>
  bool pump(Cond cond, int turns_max = 3000) {
    for (int i = 0; i < turns_max; ++i) {
      complete_sends();
      service_peers();
      if (cond()) return true;
      ring->run_once(2);
    }
    complete_sends();
    service_peers();
    return cond();
  }
  void complete_sends();
  void service_peers();
  // Everything the peers wrote has reached the adapter and been handled:
  // the peers have nothing unwritten, the adapter's sockets nothing unread,
  // no completion waits and no client send is out.
  bool settled();
  void settle() { REQUIRE(pump([&] { return settled(); })); }
  // The next request to come whole, on any connection.
  grpc_request await_request();
};

// --- the gRPC messages -------------------------------------------------------

// One ModelStreamInferResponse as Triton's vLLM backend writes it, framed:
// text_output, and the finish reason and token counts when given (a count
// below 0 is left out, as is an empty finish reason).
std::string token_message(std::string_view text, std::string_view finish = {}, int64_t input_tokens = -1,
                          int64_t output_tokens = -1);
// ModelStreamInferResponse{error_message}, framed.
std::string error_message(std::string_view text);
// The 5-byte gRPC prefix of a message of `bytes` (no message after it).
std::string frame_header(uint32_t bytes);

// What a backend reads from a framed ModelInferRequest.
struct infer_request_seen {
  std::string model_name;
  std::string id;
  std::map<std::string, std::string> inputs;  // name -> raw contents
  // The first element of a BYTES input ("<absent>" without one).
  std::string bytes_input(const std::string& name) const;
  bool bool_input(const std::string& name) const;
};
// Returns: whether `framed` is one whole gRPC message holding a ModelInferRequest.
bool read_infer_request(std::string_view framed, infer_request_seen& out);

}  // namespace sluice::adapters_test
