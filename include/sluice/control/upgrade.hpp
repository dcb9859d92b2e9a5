#pragma once
// control: the binary upgrade (SIGUSR2), as nginx does it. The running
// process forks; the child execs the program file anew (a file replaced
// since the start is what runs) with the same arguments, the listening
// sockets left open for it and named in SLUICE_INHERIT_FDS (inherit.hpp),
// and the write end of a pipe in SLUICE_READY_FD. The new process writes
// one byte there once its shards and admin listener take connections; only
// then does the old one hand the sockets over and drain (the caller's part:
// gateway::hand_over). Both processes accept from the same sockets meanwhile
// (the same open file descriptions, not copies), so nothing queued on them
// is lost. A new process that cannot exec, exits, or does not say it is
// ready within k_ready_timeout_ms is logged, and the old one serves on.
//
// Which file: argv[0] made absolute at start (relative to the start's
// working directory, or found on PATH), not /proc/self/exe: the latter
// names the file the process was loaded from, so a symlink switched to a
// new release would start the old one again; and once the file is renamed
// over it reads "... (deleted)".
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/shard/reactor.hpp"

namespace sluice::control {

// A listening socket passed on: SLUICE_INHERIT_FDS's ROLE.SHARD=FD.
struct passed_listener {
  std::string_view role;  // "listen" | "listen_tls" | "admin"
  uint32_t shard = 0;
  int fd = -1;
};

// Control-thread-local. One per process, from start-up until it exits.
class binary_upgrade {
 public:
  static constexpr uint32_t k_ready_timeout_ms = 30000;

  // Takes argv at start, before anything changes the working directory.
  binary_upgrade(shard::reactor& r, int argc, char** argv);
  ~binary_upgrade();
  binary_upgrade(const binary_upgrade&) = delete;
  binary_upgrade& operator=(const binary_upgrade&) = delete;

  // SIGUSR2: starts the new process with `fds` open in it. Returns: whether
  // it was started (else the log says why, and nothing changed).
  bool start(const std::vector<passed_listener>& fds, uint64_t now_ms);
  bool in_progress() const noexcept { return _state == state::waiting; }
  // Each loop turn. Returns: true once, when the new process said it is
  // ready (then the caller hands over and drains).
  bool on_iteration(uint64_t now_ms);
  pid_t child() const noexcept { return _pid; }
  const std::string& path() const noexcept { return _path; }

  // The new process's side: tells the old one (SLUICE_READY_FD, then
  // unset) that this one serves. No-op without it.
  static void signal_ready();

 private:
  enum class state : uint8_t { idle, waiting, failed_reaping };
  struct read_op : shard::completion {
    binary_upgrade* self = nullptr;
  };
  static void on_read(shard::completion* c, const io_uring_cqe* cqe);
  void on_read_cqe(int res) noexcept;
  // The new process failed: logged with `why`; reaped when it has exited.
  void fail(std::string why) noexcept;
  void reap(uint64_t now_ms) noexcept;

  shard::reactor& _r;
  std::string _path;               // the program file to exec (absolute)
  std::vector<std::string> _args;  // argv as at start
  state _state = state::idle;
  bool _ready = false;             // the byte came; on_iteration says so once
  bool _read_inflight = false;     // the pipe's read SQE (an fd is never closed under one)
  pid_t _pid = -1;
  int _ready_fd = -1;              // the pipe's read end
  uint64_t _deadline_ms = 0;
  char _buf[8] = {};               // 'R'; or 'E' and the exec's errno (4 bytes)
  read_op _op;
};

}  // namespace sluice::control
