// The embeddings router's pieces that need no network: the centroids'
// arithmetic, the request written for a prompt, the reply read in vLLM's
// shape and in others (chunked, spaced, wrong), the cache, and the auto
// model's decision with centroids in place.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "semantic_load.hpp"
#include "sluice/config/semantic.hpp"
#include "sluice/route/embeddings.hpp"
#include "sluice/route/groups.hpp"

using namespace sluice::route;
namespace cfg = sluice::config;

namespace {

cfg::embedding_centroids two_by_three() {
  cfg::embedding_centroids c;
  c.dim = 3;
  c.rows = {1, 0, 0, 0, 1, 0};
  c.groups = {0, 1};
  return c;
}

std::string http_reply(std::string_view body, bool chunked = false) {
  std::string out = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n";
  if (!chunked) return out + "content-length: " + std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
  out += "transfer-encoding: chunked\r\n\r\n";
  const size_t half = body.size() / 2;
  char line[32];
  std::snprintf(line, sizeof line, "%zx\r\n", half);
  out += line + std::string(body.substr(0, half)) + "\r\n";
  std::snprintf(line, sizeof line, "%zx\r\n", body.size() - half);
  out += line + std::string(body.substr(half)) + "\r\n0\r\n\r\n";
  return out;
}

}  // namespace

TEST_SUITE("route::embeddings") {
  TEST_CASE("the nearest centroid by cosine; other dimensions, zero and NaN vectors decide nothing") {
    const cfg::embedding_centroids c = two_by_three();
    float cos = 0;
    const std::vector<float> a = {3, 1, 0};
    CHECK(cfg::nearest_centroid(c, a, cos) == 0);
    CHECK(cos == doctest::Approx(3 / std::sqrt(10.0)));
    const std::vector<float> b = {0.1f, 5, 5};
    CHECK(cfg::nearest_centroid(c, b, cos) == 1);
    const std::vector<float> wrong = {1, 0};
    CHECK(cfg::nearest_centroid(c, wrong, cos) == -1);
    const std::vector<float> zero = {0, 0, 0};
    CHECK(cfg::nearest_centroid(c, zero, cos) == -1);
    const std::vector<float> nan = {NAN, 1, 0};
    CHECK(cfg::nearest_centroid(c, nan, cos) == -1);
  }

  TEST_CASE("centroids: the mean of unit vectors, made unit (a long example weighs as much as a short one)") {
    std::vector<float> sum(2, 0.0f);
    const std::vector<float> x = {100, 0}, y = {0, 1}, z = {0, 0};
    CHECK(cfg::add_unit(sum, x));
    CHECK(cfg::add_unit(sum, y));
    CHECK_FALSE(cfg::add_unit(sum, z));
    cfg::normalize(sum);
    CHECK(sum[0] == doctest::Approx(std::sqrt(0.5)));
    CHECK(sum[1] == doctest::Approx(std::sqrt(0.5)));
  }

  TEST_CASE("the request: OpenAI's body, escaped; the group's key; Connection: close") {
    std::string out;
    const std::string_view one[] = {"say \"hi\"\n\x01"};
    write_embeddings_request(out, "10.0.0.1:8000", "bge-m3", "sk-backend", one);
    const std::string body = R"({"model":"bge-m3","input":"say \"hi\"\n\u0001"})";
    CHECK(out.find("POST /v1/embeddings HTTP/1.1\r\nHost: 10.0.0.1:8000\r\n") == 0);
    CHECK(out.find("\r\nConnection: close\r\n") != std::string::npos);
    CHECK(out.find("\r\nAuthorization: Bearer sk-backend\r\n") != std::string::npos);
    CHECK(out.find("Content-Length: " + std::to_string(body.size()) + "\r\n") != std::string::npos);
    CHECK(out.substr(out.size() - body.size()) == body);
    const std::string_view two[] = {"a", "b"};
    write_embeddings_request(out, "h", "m", "", two);
    CHECK(out.find("Authorization") == std::string::npos);
    CHECK(out.substr(out.find("\r\n\r\n") + 4) == R"({"model":"m","input":["a","b"]})");
  }

  TEST_CASE("a reply is whole at its Content-Length or its terminal chunk") {
    const std::string body = R"({"data":[{"embedding":[1,2]}]})";
    const std::string cl = http_reply(body);
    CHECK(embeddings_reply_whole(cl));
    CHECK_FALSE(embeddings_reply_whole(std::string_view(cl).substr(0, cl.size() - 1)));
    const std::string ch = http_reply(body, true);
    CHECK(embeddings_reply_whole(ch));
    CHECK_FALSE(embeddings_reply_whole(std::string_view(ch).substr(0, ch.size() - 2)));
    CHECK_FALSE(embeddings_reply_whole("HTTP/1.1 200 OK\r\n\r\n{}"));  // until the close
  }

  TEST_CASE("the reader takes vLLM's shape and others; a wrong reply says what was wrong") {
    embeddings_reader r;
    std::vector<float> out;
    uint32_t dim = 0;
    std::string why;
    // vLLM's compact JSON.
    const std::string vllm = R"({"id":"embd-1","object":"list","created":1,"model":"m","data":[{"index":0,"object":"embedding","embedding":[0.5,-0.25,1.0]}],"usage":{"prompt_tokens":2,"total_tokens":2,"completion_tokens":0}})";
    REQUIRE(r.read(http_reply(vllm), 1, out, dim, why));
    CHECK(dim == 3);
    CHECK(out == std::vector<float>{0.5f, -0.25f, 1.0f});
    // Spaces, newlines, integers, chunked, two inputs.
    const std::string spaced = "{\n  \"data\" : [\n { \"embedding\" : [ 1 , 2 ] } ,\n { \"embedding\": [3,4] } ] }";
    REQUIRE(r.read(http_reply(spaced, true), 2, out, dim, why));
    CHECK(dim == 2);
    CHECK(out == std::vector<float>{1, 2, 3, 4});
    CHECK_FALSE(r.read(http_reply(spaced, true), 1, out, dim, why));
    CHECK(why == "2 embeddings for 1 inputs");
    CHECK_FALSE(r.read("HTTP/1.1 500 Internal Server Error\r\ncontent-length: 2\r\n\r\n{}", 1, out, dim, why));
    CHECK(why == "status 500");
    CHECK_FALSE(r.read(http_reply(R"({"data":[{"embedding":[1,2]},{"embedding":[3]}]})"), 2, out, dim, why));
    CHECK(why == "the embeddings differ in dimension (or one is empty)");
    CHECK_FALSE(r.read(http_reply(R"({"data":[{"embedding":["x"]}]})"), 1, out, dim, why));
    CHECK_FALSE(r.read(http_reply(R"({"object":"list"})"), 1, out, dim, why));
    CHECK(why == "the reply has no \"data\" list");
    CHECK_FALSE(r.read(http_reply("not json"), 1, out, dim, why));
    CHECK_FALSE(r.read("HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"data\":", 1, out, dim, why));
    CHECK(why == "the reply's body is cut or badly framed");
    CHECK_FALSE(r.read("garbage", 1, out, dim, why));
  }

  TEST_CASE("the cache is direct-mapped and bounded; 0 entries caches nothing") {
    decision_cache c(4);
    CHECK(c.find(7) == nullptr);
    c.put(7, 1, 0.9f);
    REQUIRE(c.find(7) != nullptr);
    CHECK(c.find(7)->row == 1);
    c.put(11, 0, 0.5f);  // 11 & 3 == 7 & 3: replaces
    CHECK(c.find(7) == nullptr);
    CHECK(c.find(11)->row == 0);
    decision_cache none(0);
    none.put(7, 1, 0.9f);
    CHECK(none.find(7) == nullptr);
  }

  TEST_CASE("the auto model in embeddings mode: pending until a vector decides, then cached; before-rules first") {
    auto c = load_for_test(R"(
[router]
semantic = "embeddings"
embeddings_group = "embed"
default_group = "chat"

[[group]]
name = "code"
backends = ["http://127.0.0.1:8000"]
examples = ["fix my python function", "why does this loop not compile"]

[[group]]
name = "chat"
backends = ["http://127.0.0.1:8000"]
examples = ["hello how are you", "tell me a joke"]

[[group]]
name = "vision"
backends = ["http://127.0.0.1:8000"]

[[group]]
name = "embed"
backends = ["http://127.0.0.1:8001"]

[[rule]]
group = "vision"
has_images = true
priority = "before"

[[key]]
id = "k"
key = "secret"
)");
    group_table t(*c);
    sluice::openai::request_fields f;
    f.model = "auto";
    f.last_user_message = f.first_user_message = "fix my python function";
    f.message_count = 1;
    // No centroids yet: the classifier decides.
    decision d = t.decide(f, k_none, false);
    CHECK_FALSE(d.pending);
    CHECK(d.how == decision_how::classifier);
    auto cen = std::make_shared<cfg::embedding_centroids>();
    cen->dim = 2;
    cen->rows = {1, 0, 0, 1};
    cen->groups = {0, 1};
    c->router.centroids->publish(cen);
    d = t.decide(f, k_none, false);
    REQUIRE(d.pending);
    const embed_input in = t.pending_input();
    CHECK(in.user == "fix my python function");
    const std::vector<float> v = {0.2f, 0.9f};
    d = t.embedding_decision(*cen, v, in, k_none);
    CHECK(d.group == 1);
    CHECK(d.how == decision_how::embeddings);
    d = t.decide(f, k_none, false);  // from the cache now
    CHECK_FALSE(d.pending);
    CHECK(d.cached);
    CHECK(d.group == 1);
    // Without the embeddings (a failed call): the classifier.
    d = t.decide(f, k_none, false, false);
    CHECK(d.how == decision_how::classifier);
    // A before-rule decides ahead of the embeddings.
    f.has_images = true;
    d = t.decide(f, k_none, false);
    CHECK_FALSE(d.pending);
    CHECK(d.group == 2);
  }
}
