#pragma once
// grpc: what both of sluice's gRPC clients -- the Triton adapter and the
// health probe's readiness RPCs -- ask of an HTTP/2 client session, made
// once here: the session's options (the bounds on what a server can make
// it hold), a call's request head, and the grpc-timeout field.
#include <nghttp2/nghttp2.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace sluice::grpc {

// The options of a client session: few SETTINGS entries and few
// CONTINUATION frames per header block from the server; `manual_window`:
// the owner gives stream windows back as its clients take the bytes
// (backpressure). Returns: null when out of memory (nghttp2_option_del it).
nghttp2_option* new_client_options(bool manual_window) noexcept;

// grpc-timeout's value: at most 8 digits and a unit (gRPC's PROTOCOL-HTTP2),
// milliseconds while they fit, else seconds (capped), into out[0, 16).
// Returns: its length (at most 9).
size_t write_timeout(char* out, uint64_t ms) noexcept;

// A gRPC call's request head: POST `path` to `authority`, the gRPC content
// type, te: trailers, `user_agent`, then grpc-accept-encoding (when
// `identity_only`) and grpc-timeout (when not empty). Names are literals
// (NO_COPY_NAME); values are copied by nghttp2 at submit. Returns: the
// fields written into nv.
inline constexpr size_t k_call_head_fields_max = 9;
size_t call_head(nghttp2_nv (&nv)[k_call_head_fields_max], std::string_view path, std::string_view authority,
                 std::string_view user_agent, std::string_view timeout, bool identity_only) noexcept;

}  // namespace sluice::grpc
