// The gRPC clients' shared request head, timeout field and session options
// (sluice/grpc/h2_client.hpp).
#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/grpc/h2_client.hpp"

namespace grpc = sluice::grpc;

namespace {

std::vector<std::pair<std::string, std::string>> fields_of(const nghttp2_nv* nv, size_t n) {
  std::vector<std::pair<std::string, std::string>> v;
  for (size_t i = 0; i < n; ++i) {
    v.emplace_back(std::string(reinterpret_cast<const char*>(nv[i].name), nv[i].namelen),
                   std::string(reinterpret_cast<const char*>(nv[i].value), nv[i].valuelen));
    CHECK(nv[i].flags == NGHTTP2_NV_FLAG_NO_COPY_NAME);  // values copied at submit: a stack timeout may go
  }
  return v;
}

}  // namespace

TEST_CASE("a gRPC call's head: the pseudo-fields first, the gRPC fields, the optional ones only when asked") {
  nghttp2_nv nv[grpc::k_call_head_fields_max];
  size_t n = grpc::call_head(nv, "/inference.GRPCInferenceService/ModelStreamInfer", "triton:8001", "sluice", "30000m", true);
  CHECK(fields_of(nv, n) == std::vector<std::pair<std::string, std::string>>{
                                {":method", "POST"},
                                {":scheme", "http"},
                                {":path", "/inference.GRPCInferenceService/ModelStreamInfer"},
                                {":authority", "triton:8001"},
                                {"content-type", "application/grpc"},
                                {"te", "trailers"},
                                {"user-agent", "sluice"},
                                {"grpc-accept-encoding", "identity"},
                                {"grpc-timeout", "30000m"},
                            });
  n = grpc::call_head(nv, "/p", "h", "sluice-health", {}, false);
  const auto f = fields_of(nv, n);
  REQUIRE(f.size() == 7);
  CHECK(f.back() == std::pair<std::string, std::string>{"user-agent", "sluice-health"});
}

TEST_CASE("grpc-timeout: at most 8 digits and a unit, milliseconds while they fit, then seconds, capped") {
  const auto t = [](uint64_t ms) {
    char out[16];
    return std::string(out, grpc::write_timeout(out, ms));
  };
  CHECK(t(1) == "1m");
  CHECK(t(99'999'999) == "99999999m");
  CHECK(t(100'000'000) == "100000S");
  CHECK(t(UINT64_MAX) == "99999999S");
}

TEST_CASE("a client session's options are made (null only out of memory) and take a session") {
  for (bool manual : {false, true}) {
    nghttp2_option* opt = grpc::new_client_options(manual);
    REQUIRE(opt != nullptr);
    nghttp2_session_callbacks* cbs = nullptr;
    REQUIRE(nghttp2_session_callbacks_new(&cbs) == 0);
    nghttp2_session* s = nullptr;
    CHECK(nghttp2_session_client_new2(&s, cbs, nullptr, opt) == 0);
    nghttp2_session_del(s);
    nghttp2_session_callbacks_del(cbs);
    nghttp2_option_del(opt);
  }
}
