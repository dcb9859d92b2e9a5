#include <doctest/doctest.h>

#include <simdjson.h>

#include <string>

#include "sluice/openai/error.hpp"

using sluice::openai::normalize_backend_error;

namespace {

struct normalized {
  uint16_t status = 0;
  std::string body;
};

normalized run(uint16_t status, std::string_view body, bool overflow = false) {
  char out[1024];
  normalized n;
  const size_t len = normalize_backend_error(status, body, overflow, out, sizeof out, n.status);
  n.body.assign(out, len);
  return n;
}

// The four fields of an OpenAI error body ("null" for a JSON null).
struct fields {
  std::string message, type, param, code;
};

fields parse(const std::string& body) {
  simdjson::dom::parser p;
  simdjson::dom::element e = p.parse(body);
  fields f;
  auto text = [](simdjson::dom::element v) {
    if (v.is_null()) return std::string("null");
    return std::string(std::string_view(v.get_string()));
  };
  f.message = text(e["error"]["message"]);
  f.type = text(e["error"]["type"]);
  f.param = text(e["error"]["param"]);
  f.code = text(e["error"]["code"]);
  return f;
}

}  // namespace

TEST_SUITE("openai::normalize_backend_error") {
  TEST_CASE("vLLM's flat error body becomes OpenAI's shape, message kept, integer code dropped") {
    const auto n = run(400, R"({"object":"error","message":"max_tokens must be at least 1, got -3.","type":"BadRequestError","param":null,"code":400})");
    CHECK(n.status == 400);
    const fields f = parse(n.body);
    CHECK(f.message == "max_tokens must be at least 1, got -3.");
    CHECK(f.type == "invalid_request_error");
    CHECK(f.param == "null");
    CHECK(f.code == "null");
  }

  TEST_CASE("an OpenAI-shaped body keeps its fields; an integer code becomes null") {
    const auto a = run(404, R"({"error":{"message":"The model `x` does not exist.","type":"not_found_error","param":"model","code":"model_not_found"}})");
    const fields f = parse(a.body);
    CHECK(a.status == 404);
    CHECK(f.message == "The model `x` does not exist.");
    CHECK(f.type == "not_found_error");
    CHECK(f.param == "model");
    CHECK(f.code == "model_not_found");
    const fields g = parse(run(400, R"({"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}})").body);
    CHECK(g.type == "invalid_request_error");
    CHECK(g.code == "null");
  }

  TEST_CASE("a backend 401 or 403 is the gateway's credential refused: 502, never the client's invalid_api_key") {
    for (uint16_t s : {401, 403}) {
      const auto n = run(s, R"({"error":"Unauthorized"})");
      CHECK(n.status == 502);
      const fields f = parse(n.body);
      CHECK(f.type == "server_error");
      CHECK(f.code == "bad_gateway");
      CHECK(f.message.find("credentials") != std::string::npos);
    }
  }

  TEST_CASE("FastAPI's detail, a bare error string, and unreadable bodies") {
    CHECK(parse(run(422, R"({"detail":"Field required"})").body).message == "Field required");
    CHECK(parse(run(500, R"({"error":"engine dead"})").body).message == "engine dead");
    const auto junk = run(503, "<html>Service Unavailable</html>");
    CHECK(junk.status == 503);
    CHECK(parse(junk.body).message == "The backend answered HTTP 503.");
    CHECK(parse(junk.body).type == "server_error");
    CHECK(parse(run(500, R"({"object":"error","message":"x"})", true).body).message == "The backend answered HTTP 500.");
    CHECK(parse(run(400, "").body).type == "invalid_request_error");
  }

  TEST_CASE("a message with quotes, control bytes and a long tail stays valid JSON within the buffer") {
    std::string long_message(5000, 'm');
    const auto n = run(400, R"({"object":"error","message":"say \"hi\"\n)" + long_message + R"(","code":400})");
    CHECK(n.body.size() <= 1024);
    const fields f = parse(n.body);
    CHECK(f.message.rfind("say \"hi\"\nmmm", 0) == 0);
  }
}
