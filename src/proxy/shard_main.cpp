// A shard thread from start to stop: everything here runs on the shard's own
// thread. It meets the control thread only in its shard_link: the inbox it
// drains between completions and the flags and counters it publishes.
#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include "shard_server.hpp"
#include "sluice/core/log.hpp"
#include "sluice/proxy/shard.hpp"
#include "sluice/shard/cpuset.hpp"

namespace sluice::proxy {

namespace {

void name_and_pin(const shard_link& link) noexcept {
  char name[16];  // the kernel's limit for a thread name, with its NUL
  auto r = fmt::format_to_n(name, sizeof name - 1, "sluice-shard{}", link.index);
  name[r.size] = '\0';
  shard::name_current_thread(name);
  if (link.cpu >= 0 && !shard::pin_current_thread(link.cpu)) {
    log::warn("shard {}: could not pin to cpu {}", link.index, link.cpu);
  }
  if (link.cpu < 0 && !link.cpus_allowed.empty() && !shard::allow_current_thread(link.cpus_allowed)) {
    log::warn("shard {}: could not run on cpus {}", link.index, shard::format_cpu_list(link.cpus_allowed));
  }
}

// The start failed: the control thread, waiting on `ready`, sees `failed`
// and stops the others.
void report_failed_start(shard_link& link) noexcept {
  link.failed = true;
  link.ready = true;
  link.ready.notify_all();
  link.stopped = true;
}

// Peers and the control thread wake this shard through its slot in the
// mesh's reactor array (null while it does not run). The slot is this
// shard's to write; the mesh view is const only for the other shards.
void publish_reactor(shard_link& link, shard::reactor* r) noexcept {
  const_cast<std::atomic<shard::reactor*>*>(link.mesh.reactors)[link.index].store(r, std::memory_order_release);
}

void apply(shard_server& srv, control_message& m, uint64_t now_ms) noexcept {
  if (m.what == control_message::kind::drain) srv.begin_drain(now_ms + m.drain_ms);
  if (m.what == control_message::kind::handover) srv.begin_drain(now_ms + m.drain_ms, true);
  if (m.what == control_message::kind::reopen_audit) srv.reopen_audit();
  if (m.what == control_message::kind::route) srv.apply_route(m.r);
  if (m.what == control_message::kind::store) {
    srv.on_store_answer(m.store_seq, m.record, m.store_unavailable);  // the record is the shard's now
    m.record = nullptr;
  }
  if (m.what == control_message::kind::reload) {
    std::unique_ptr<std::shared_ptr<const config::config>> next(m.snapshot);
    std::unique_ptr<std::shared_ptr<const tls::context>> tls(m.tls);
    srv.reload(std::move(*next));
    if (tls) srv.set_tls_context(std::move(*tls));
  }
}

// The loop's hook, once per turn: the control messages first, so that a
// drain or a reload holds from this turn's completions on.
struct loop_ctx {
  shard_link* link;
  shard_server* srv;
  shard::reactor* r;
};

void before_completions(void* p, uint64_t now_ms) { static_cast<loop_ctx*>(p)->srv->before_completions(now_ms); }

void on_iteration(void* p, uint64_t now_ms) {
  auto* c = static_cast<loop_ctx*>(p);
  control_message m;
  while (c->link->inbox.try_pop(m)) {
    apply(*c->srv, m, now_ms);
    // Only this thread writes `applied`: a plain increment, published with
    // release so that what the message did is visible with the count.
    c->link->applied.store(c->link->applied.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  c->srv->on_iteration(now_ms);
  if (c->srv->drained()) c->r->stop();
}

}  // namespace

void run_shard(shard_link& link) noexcept {
  name_and_pin(link);
  shard::reactor::options ro;
  ro.idle_poll_us = link.cfg->server.idle_poll_us;
  ro.batch_wait_us = link.cfg->server.batch_wait_us;
  // Every client and backend socket of the shard takes a slot while one is
  // free (the rest are served by their plain fd).
  ro.file_slots = 8192;
  link.owned_reactor = shard::reactor::create(ro);
  if (!link.owned_reactor) {
    report_failed_start(link);
    return;
  }
  shard::reactor& rx = *link.owned_reactor;
  shard_server srv(link.index, link.cfg, rx, link.listen_fd, link.tls_listen_fd, *link.metrics, link.mesh);
  link.listen_fd = link.tls_listen_fd = -1;  // owned by srv now
  if (link.tls) srv.set_tls_context(link.tls);
  if (!srv.init()) {
    report_failed_start(link);
    return;
  }
  log::debug("shard {} on cpu{} {}: io_uring {}, {} registered-file slots", link.index, link.cpu >= 0 ? "" : "s",
             link.cpu >= 0 ? std::to_string(link.cpu) : shard::format_cpu_list(link.cpus_allowed), rx.setup_mode(),
             rx.file_slots());
  link.reactor = &rx;
  publish_reactor(link, &rx);
  link.ready = true;
  link.ready.notify_all();

  loop_ctx ctx{&link, &srv, &rx};
  shard::reactor::hooks h;
  h.ctx = &ctx;
  h.before_completions = &before_completions;
  h.on_iteration = &on_iteration;
  rx.run(h);
  publish_reactor(link, nullptr);
  // Every request has ended: what is left in the audit batch goes to disk
  // before the shard says it stopped (SIGTERM loses no completed line).
  srv.close_audit();
  link.stopped = true;
}

}  // namespace sluice::proxy
