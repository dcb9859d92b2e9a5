// The response store ([responses] store = "local"): what a put keeps (its
// conversation completed by its output items), who may read and delete it,
// and its bounds (time, bytes; oldest first).
#include <doctest/doctest.h>

#include <string>

#include "sluice/control/responses.hpp"

using sluice::control::response_store;
using sluice::control::route_book;
using sluice::proxy::store_record;

namespace {

store_record record(std::string id, std::string key, std::string items, std::string text, size_t pad = 0) {
  store_record r;
  r.id = std::move(id);
  r.key_id = std::move(key);
  r.items = std::move(items);
  r.response = R"({"id":")" + r.id + R"(","object":"response","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":")" +
               text + std::string(pad, 'x') + R"("}]}],"usage":null})";
  return r;
}

}  // namespace

TEST_SUITE("control::response_store") {
  TEST_CASE("a put keeps the conversation and its output items; its key reads it, another does not") {
    response_store s(1 << 20, 60000);
    REQUIRE(s.put(record("resp_1", "alice", R"({"type":"message","role":"user","content":"hi"})", "hello"), 1000));
    const store_record* r = s.get("resp_1", "alice", 1001);
    REQUIRE(r != nullptr);
    CHECK(r->items ==
          R"({"type":"message","role":"user","content":"hi"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hello"}]})");
    CHECK(r->response.find(R"("id":"resp_1")") != std::string::npos);
    CHECK(s.get("resp_1", "bob", 1001) == nullptr);
    CHECK(s.get("resp_2", "alice", 1001) == nullptr);
    CHECK_FALSE(s.remove("resp_1", "bob"));
    CHECK(s.get("resp_1", "alice", 1001) != nullptr);
    CHECK(s.remove("resp_1", "alice"));
    CHECK(s.get("resp_1", "alice", 1001) == nullptr);
    CHECK_FALSE(s.remove("resp_1", "alice"));
    CHECK(s.size() == 0);
    CHECK(s.bytes() == 0);
  }

  TEST_CASE("a response that is not a response object is not kept") {
    response_store s(1 << 20, 60000);
    store_record r = record("resp_1", "k", "", "x");
    r.response = "not json";
    CHECK_FALSE(s.put(std::move(r), 0));
    store_record no_output = record("resp_2", "k", "", "x");
    no_output.response = R"({"id":"resp_2"})";
    CHECK_FALSE(s.put(std::move(no_output), 0));
    CHECK(s.size() == 0);
  }

  TEST_CASE("time: an entry lives ttl after its put, then reads as gone and is dropped") {
    response_store s(1 << 20, 5000);
    REQUIRE(s.put(record("resp_1", "k", "", "a"), 1000));
    REQUIRE(s.put(record("resp_2", "k", "", "b"), 3000));
    CHECK(s.get("resp_1", "k", 5999) != nullptr);
    CHECK(s.get("resp_1", "k", 6000) == nullptr);
    s.expire(6000);
    CHECK(s.size() == 1);
    CHECK(s.get("resp_2", "k", 6000) != nullptr);
    s.expire(8000);
    CHECK(s.size() == 0);
    CHECK(s.bytes() == 0);
  }

  TEST_CASE("bytes: past the bound the oldest go first; a replaced id counts once; one larger than all is not kept") {
    response_store s(16 * 1024, 60000);
    for (int i = 0; i < 10; ++i) REQUIRE(s.put(record("resp_" + std::to_string(i), "k", "", "t", 1000), 0));
    CHECK(s.bytes() <= 16 * 1024);
    CHECK(s.get("resp_9", "k", 1) != nullptr);
    CHECK(s.get("resp_0", "k", 1) == nullptr);
    const size_t kept = s.size();
    CHECK(kept >= 5);  // ~2.4 KiB each: the output text is in the items and in the response
    CHECK(kept <= 7);
    // Putting an id again replaces it: the same count, the newest content.
    REQUIRE(s.put(record("resp_9", "k", "", "again", 1000), 1));
    CHECK(s.size() == kept);
    CHECK(s.get("resp_9", "k", 2)->items.find("again") != std::string::npos);
    // The replaced entry's old place in the order does not evict the new one.
    for (int i = 10; i < 13; ++i) REQUIRE(s.put(record("resp_" + std::to_string(i), "k", "", "t", 1000), 2));
    CHECK(s.get("resp_9", "k", 3) != nullptr);
    REQUIRE(s.put(record("resp_big", "k", "", "t", 20000), 3));
    CHECK(s.get("resp_big", "k", 4) == nullptr);
    CHECK(s.get("resp_12", "k", 4) != nullptr);
  }

  TEST_CASE("route book: per key, replaced by a later put, bounded by count oldest first, and by time") {
    route_book b(3, 5000);
    b.put("k", "resp_1", "http://a:1", 1000);
    b.put("k", "resp_2", "http://b:2", 1000);
    REQUIRE(b.get("k", "resp_1", 1001) != nullptr);
    CHECK(*b.get("k", "resp_1", 1001) == "http://a:1");
    CHECK(b.get("other", "resp_1", 1001) == nullptr);  // another key's response is not its own
    // A key id and a response id that would run together stay apart.
    b.put("k:1", "x", "http://c:3", 1000);
    CHECK(b.get("k", "1:x", 1001) == nullptr);
    // Put again: the newest backend; the old place in the order evicts nothing.
    b.put("k", "resp_1", "http://b:2", 2000);
    CHECK(*b.get("k", "resp_1", 2001) == "http://b:2");
    CHECK(b.size() == 3);
    b.put("k", "resp_3", "http://a:1", 2000);  // past 3: the oldest (resp_2) goes
    CHECK(b.size() == 3);
    CHECK(b.get("k", "resp_2", 2001) == nullptr);
    CHECK(b.get("k", "resp_1", 2001) != nullptr);
    CHECK(b.get("k", "resp_3", 2001) != nullptr);
    // Time: "k:1"'s entry (put at 1000) expires at 6000; resp_1 and resp_3 at 7000.
    CHECK(b.get("k:1", "x", 6000) == nullptr);
    b.expire(6000);
    CHECK(b.size() == 2);
    b.expire(7000);
    CHECK(b.size() == 0);
    CHECK(route_book::entries_for(64u << 20) == (64u << 20) / 256);
    CHECK(route_book::entries_for(0) == 1024);
  }
}

