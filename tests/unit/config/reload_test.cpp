#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "sluice/config/config.hpp"

namespace cfg = sluice::config;

namespace {

std::shared_ptr<const cfg::config> load(std::string_view text) { return cfg::load(text, "test.toml", {}); }

// Two groups over three backends, a rule, a default group and two keys.
constexpr std::string_view k_running = R"(
[router]
default_group = "chat"

[[group]]
name = "chat"
models = ["chat-*"]
backends = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]

[[group]]
name = "code"
models = ["code-*"]
backends = ["http://127.0.0.1:8002", "http://127.0.0.1:8003"]

[[rule]]
group = "code"
contains_any = ["python"]

[[key]]
id = "alice"
key = "alice-secret"
requests_per_minute = 10

[[key]]
id = "bob"
key = "bob-secret"
)";

// The same service edited: "code" listed first, backend 8001 gone, 8004
// new, a group "vision" new, alice re-limited, bob re-keyed, carol new.
constexpr std::string_view k_edited = R"(
[router]
default_group = "vision"

[[group]]
name = "code"
models = ["code-*"]
backends = ["http://127.0.0.1:8003", "http://127.0.0.1:8004"]

[[group]]
name = "vision"
models = ["vl-*"]
backends = ["http://127.0.0.1:8004"]

[[group]]
name = "chat"
models = ["chat-*"]
backends = ["http://127.0.0.1:8002"]

[[rule]]
group = "vision"
has_images = true

[[rule]]
group = "code"
contains_any = ["python"]

[[key]]
id = "carol"
key = "carol-secret"

[[key]]
id = "bob"
key = "bob-new-secret"

[[key]]
id = "alice"
key = "alice-secret"
requests_per_minute = 20
)";

size_t index_of_backend(const cfg::config& c, std::string_view url) {
  for (size_t i = 0; i < c.backends.size(); ++i) {
    if (c.backends[i].url == url) return i;
  }
  return SIZE_MAX;
}

}  // namespace

TEST_SUITE("config::reconcile") {
  TEST_CASE("backends, groups and keys keep their positions; removed ones stay as placeholders; new ones are appended") {
    auto running = load(k_running);
    auto next = load(k_edited);
    std::vector<std::string> notes;
    auto r = cfg::reconcile(*next, *running, cfg::capacity_for(*running), notes);

    // Backends: 8001 (0) removed in place, 8002 (1) and 8003 (2) kept, 8004 appended.
    REQUIRE(r->backends.size() == 4);
    for (size_t i = 0; i < running->backends.size(); ++i) CHECK(r->backends[i].url == running->backends[i].url);
    CHECK(r->backends[0].removed);
    CHECK_FALSE(r->backends[1].removed);
    CHECK_FALSE(r->backends[2].removed);
    CHECK(r->backends[3].url == "http://127.0.0.1:8004");
    CHECK_FALSE(r->backends[3].removed);

    // Groups: chat (0) and code (1) in place, vision appended.
    REQUIRE(r->groups.size() == 3);
    CHECK(r->groups[0].name == "chat");
    CHECK(r->groups[1].name == "code");
    CHECK(r->groups[2].name == "vision");
    // Their backend indices point at the reconciled backends.
    CHECK(r->groups[0].backends == std::vector<uint32_t>{1});
    CHECK(r->groups[1].backends == std::vector<uint32_t>{2, 3});
    CHECK(r->groups[2].backends == std::vector<uint32_t>{3});
    for (const auto& g : r->groups) {
      for (uint32_t b : g.backends) CHECK_FALSE(r->backends[b].removed);
    }
    // Rules and the default group follow the names.
    REQUIRE(r->rules.size() == 2);
    CHECK(r->rules[0].group_index == 2);
    CHECK(r->rules[1].group_index == 1);
    CHECK(r->router.default_group_index == 2);

    // Keys: bob (same limits, new secret) keeps position 1 with the new
    // digest; alice's new limits make a new entry; her old one never matches.
    REQUIRE(r->keys.size() == 4);
    CHECK(r->keys[0].id == "alice");
    CHECK(r->keys[0].removed);
    CHECK(r->keys[0].key_sha256 == std::array<uint8_t, 32>{});
    CHECK(r->keys[1].id == "bob");
    CHECK_FALSE(r->keys[1].removed);
    CHECK(r->keys[1].key_sha256 == cfg::sha256("bob-new-secret"));
    CHECK(r->keys[2].id == "carol");
    CHECK(r->keys[3].id == "alice");
    CHECK(r->keys[3].requests_per_minute == 20);
    CHECK(r->keys[3].key_sha256 == cfg::sha256("alice-secret"));

    REQUIRE_FALSE(notes.empty());
    CHECK(notes.back().find("backends: 3 live (1 new, 1 removed)") != std::string::npos);
    CHECK(notes.back().find("groups: 3 live (1 new, 0 removed)") != std::string::npos);
    CHECK(notes.back().find("1 with new limits") != std::string::npos);
  }

  TEST_CASE("a removed group matches no model, keeps its settings for requests in flight, and can come back in place") {
    auto running = load(k_running);
    auto without_code = load(R"(
[[group]]
name = "chat"
models = ["chat-*"]
backends = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]

[[key]]
id = "bob"
key = "bob-secret"
)");
    std::vector<std::string> notes;
    auto r1 = cfg::reconcile(*without_code, *running, cfg::capacity_for(*running), notes);
    REQUIRE(r1->groups.size() == 2);
    CHECK(r1->groups[1].name == "code");
    CHECK(r1->groups[1].removed);
    CHECK(r1->groups[1].models.empty());
    CHECK(r1->groups[1].backends == running->groups[1].backends);
    CHECK(r1->backends[2].removed);  // 8003 was only in "code"
    CHECK(r1->keys[0].removed);      // alice
    CHECK(r1->router.default_group_index == UINT32_MAX);

    // The running file again: everything back at its first position.
    auto r2 = cfg::reconcile(*running, *r1, cfg::capacity_for(*running), notes);
    REQUIRE(r2->groups.size() == 2);
    CHECK_FALSE(r2->groups[1].removed);
    CHECK(r2->groups[1].models == running->groups[1].models);
    REQUIRE(r2->backends.size() == 3);
    CHECK_FALSE(r2->backends[2].removed);
    CHECK(index_of_backend(*r2, "http://127.0.0.1:8003") == 2);
    // A key that was removed comes back as a new entry (fresh buckets).
    REQUIRE(r2->keys.size() == 3);
    CHECK(r2->keys[0].removed);
    CHECK(r2->keys[2].id == "alice");
    CHECK_FALSE(r2->keys[2].removed);
  }

  TEST_CASE("[server] and [audit] keep their running values, with a note") {
    auto running = load(k_running);
    std::string edited(k_running);
    edited = "[server]\nlisten = \"127.0.0.1:9999\"\nheader_timeout_ms = 77\n\n[audit]\npath = \"other.jsonl\"\nfsync_interval_ms = 5\n" + edited;
    auto next = load(edited);
    std::vector<std::string> notes;
    auto r = cfg::reconcile(*next, *running, cfg::capacity_for(*running), notes);
    CHECK(r->server.listen.text == running->server.listen.text);
    CHECK(r->server.header_timeout_ms == running->server.header_timeout_ms);
    CHECK(r->audit.path == running->audit.path);
    CHECK(r->audit.fsync_interval_ms == running->audit.fsync_interval_ms);
    REQUIRE(notes.size() == 4);
    CHECK(notes[0].find("[server] changed") == 0);
    CHECK(notes[1].find("[audit] path changed to \"other.jsonl\"") == 0);
    CHECK(notes[2].find("[audit] fsync_interval_ms changed to 5") == 0);
  }

  TEST_CASE("[cluster] keeps its running values, with a note") {
    auto running = load(k_running);
    auto next = load("[cluster]\nredis = \"redis://127.0.0.1:6379\"\nexpected_instances = 3\n" + std::string(k_running));
    std::vector<std::string> notes;
    auto r = cfg::reconcile(*next, *running, cfg::capacity_for(*running), notes);
    CHECK_FALSE(r->cluster.enabled());
    CHECK(r->cluster.expected_instances == 1);
    REQUIRE(notes.size() == 2);
    CHECK(notes[0].find("[cluster] changed") == 0);
  }

  TEST_CASE("an unchanged file reconciles to the same positions and no changes") {
    auto running = load(k_running);
    std::vector<std::string> notes;
    auto r = cfg::reconcile(*load(k_running), *running, cfg::capacity_for(*running), notes);
    CHECK(r->backends.size() == running->backends.size());
    CHECK(r->groups.size() == running->groups.size());
    CHECK(r->keys.size() == running->keys.size());
    REQUIRE(notes.size() == 1);
    CHECK(notes[0] == "backends: 3 live (0 new, 0 removed); groups: 2 live (0 new, 0 removed); keys: 2 live (0 with new limits)");
  }

  TEST_CASE("a reload beyond the process's room is refused with a message that says to restart") {
    auto running = load(k_running);
    cfg::reload_capacity room = cfg::capacity_for(*running);
    CHECK(room.backends == running->backends.size() + 32);
    room.backends = 3;  // no room for 8004
    std::vector<std::string> notes;
    std::string message;
    try {
      cfg::reconcile(*load(k_edited), *running, room, notes);
    } catch (const cfg::config_error& e) {
      message = e.what();
    }
    CHECK(message.find("test.toml: this reload needs 4 backends") == 0);
    CHECK(message.find("restart sluice to apply it") != std::string::npos);
  }
}
