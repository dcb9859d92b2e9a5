#pragma once
// client (private): whether a client connection's multishot receive runs.
//
// Shard-local; one per client connection, for its whole life. A receive is
// armed, or ended (the kernel ended the multishot, or it completed), and
// independently the connection may hold it paused: with too much pipelined
// input held it cancels the receive and does not re-arm until resumed.
// The cancel's completion can come after the resume (the response ended in
// between): it then re-arms, since a resume that found the receive still
// armed could not. Pure state; the caller does the ring operations.
#include <cstdint>

namespace sluice::proxy {

class receive_gate {
 public:
  // The caller submitted the receive.
  void on_armed() noexcept { _armed = true; }
  // A completion without IORING_CQE_F_MORE: the receive has ended.
  void on_ended() noexcept { _armed = false; }
  // Too much input held. Returns: whether an armed receive must be
  // cancelled (once per pause).
  bool pause() noexcept {
    if (_paused) return false;
    _paused = true;
    return _armed;
  }
  void resume() noexcept { _paused = false; }
  // Returns: whether the caller should arm the receive now.
  bool wants_arm() const noexcept { return !_armed && !_paused; }
  bool armed() const noexcept { return _armed; }
  bool paused() const noexcept { return _paused; }

 private:
  bool _armed = false;
  bool _paused = false;
};

}  // namespace sluice::proxy
