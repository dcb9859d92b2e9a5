// Fuzz target: the semantic classifier's input path (route::group_table::
// decide over config::semantic_normalize and semantic_classifier) on
// arbitrary bytes as the last user message, the system prompt and the
// session's first message: any bytes (invalid UTF-8 included -- the request
// reader refuses those earlier, but the classifier must not depend on it)
// give a group or the default, with a confidence in [0, 1], never a crash
// or a read past the scratch buffers. The classifier trains once, from a
// few examples, at the first input, both ways: the example scorer and
// fastText. The same bytes also go to the embeddings
// router's reader as a backend's /v1/embeddings reply.
#include <cmath>
#include <memory>
#include <string>
#include <string_view>

#include "fuzz_common.hpp"
#include "sluice/config/config.hpp"
#include "sluice/route/embeddings.hpp"
#include "sluice/route/groups.hpp"

namespace {

constexpr std::string_view k_config = R"(
[router]
semantic = "classifier"
default_group = "b"
semantic_bytes = 256
include_system = true
min_confidence = 0.4

[[group]]
name = "a"
backends = ["http://127.0.0.1:8000"]
examples = ["fix my python function", "why does the C compiler fail", "写一个排序函数", "segfault in my code"]

[[group]]
name = "b"
backends = ["http://127.0.0.1:8000"]
examples = ["hello how are you", "tell me a joke", "你好，最近怎么样", "what should I cook tonight"]

[[rule]]
group = "a"
contains_any = ["zzqq"]
priority = "before"

[[key]]
id = "k"
key = "k"
)";

// The same config with fastText's classifier instead of the example scorer.
std::string fasttext_config() {
  std::string c(k_config);
  c.insert(c.find("min_confidence"), "classifier = \"fasttext\"\n");
  return c;
}

struct state {
  std::shared_ptr<const sluice::config::config> cfg = sluice::config::load(k_config, "fuzz.toml", {});
  std::shared_ptr<const sluice::config::config> ft_cfg = sluice::config::load(fasttext_config(), "fuzz.toml", {});
  sluice::route::group_table table{*cfg};
  sluice::route::group_table ft_table{*ft_cfg};
  sluice::route::embeddings_reader reader;
  std::vector<float> vec;
  std::string why;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static state* s = new state();  // trained once; kept for the process
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  // The first byte picks how the input is cut into system / first / last.
  const size_t cut = size == 0 ? 0 : data[0] % (size + 1);
  sluice::openai::request_fields f;
  f.model = "auto";
  f.system_prompt = in.substr(0, cut / 2);
  f.first_user_message = in.substr(cut / 2, cut - cut / 2);
  f.last_user_message = in.substr(cut);
  f.has_images = size > 1 && (data[1] & 1) != 0;
  for (sluice::route::group_table* t : {&s->table, &s->ft_table}) {
    for (const bool sticky : {false, true}) {
      const sluice::route::decision d = t->decide(f, 0, sticky);
      SLUICE_FUZZ_CHECK(d.group == 0 || d.group == 1);
      SLUICE_FUZZ_CHECK(d.confidence == -1.0f || (d.confidence >= 0.0f && d.confidence <= 1.0f));
    }
    // Raw bytes straight into inference (no normalisation), bounded as the
    // classifier requires, with shape bits from the second byte.
    sluice::route::semantic_classifier* c = t->classifier();
    const std::string_view raw = in.substr(0, c->text_capacity());
    const int32_t label = c->infer(raw, size > 1 ? static_cast<uint8_t>(data[1] & 0x3F) : 0);
    SLUICE_FUZZ_CHECK(label >= -1 && label < 2);
    if (label >= 0) {
      float sum = 0;
      for (float p : c->probabilities()) {
        SLUICE_FUZZ_CHECK(std::isfinite(p) && p >= 0.0f && p <= 1.0f);
        sum += p;
      }
      SLUICE_FUZZ_CHECK(std::fabs(sum - 1.0f) < 1e-3f);
    }
  }
  // The embeddings router's reply path: the same bytes as a backend's
  // reply to /v1/embeddings. Read or refused with a reason, never more
  // vectors than asked for, each of one dimension.
  (void)sluice::route::embeddings_reply_whole(in);
  uint32_t dim = 0;
  if (s->reader.read(in, 1, s->vec, dim, s->why)) {
    SLUICE_FUZZ_CHECK(dim > 0 && s->vec.size() == dim);
  } else {
    SLUICE_FUZZ_CHECK(!s->why.empty());
  }
  return 0;
}
