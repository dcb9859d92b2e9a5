// The binary upgrade (SIGUSR2): fork, exec the program file with the
// listening sockets and a readiness pipe, wait for its byte. See
// upgrade.hpp. Between fork() and execve() the child of this multi-threaded
// process calls only async-signal-safe functions: everything it needs
// (argv, the environment, which fds to keep) is made before the fork.
#include "sluice/control/upgrade.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "sluice/control/notify.hpp"
#include "sluice/core/log.hpp"

extern char** environ;

namespace sluice::control {

namespace {

// Variables the new process gets from this upgrade only: an inherited copy
// of them would name fds it does not have.
bool passed_by_upgrade(std::string_view v) noexcept {
  for (std::string_view name : {"SLUICE_INHERIT_FDS=", "SLUICE_READY_FD=", "LISTEN_FDS=", "LISTEN_PID=",
                                "LISTEN_FDNAMES="}) {
    if (v.starts_with(name)) return true;
  }
  return false;
}

std::string absolute(std::string p) {
  if (!p.empty() && p[0] == '/') return p;
  while (p.starts_with("./")) p.erase(0, 2);
  char cwd[PATH_MAX];
  if (::getcwd(cwd, sizeof cwd) == nullptr) return p;
  return std::string(cwd) + "/" + p;
}

// argv[0] as the shell found it: a path (made absolute), or a name looked
// up on PATH; else the file this process was loaded from.
std::string program_path(const char* argv0) {
  const std::string a = argv0 != nullptr ? argv0 : "";
  if (a.find('/') != std::string::npos) return absolute(a);
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "";
  while (!a.empty() && !dirs.empty()) {
    const size_t colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    dirs = colon == std::string_view::npos ? std::string_view() : dirs.substr(colon + 1);
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + a;
    if (::access(candidate.c_str(), X_OK) == 0) return absolute(candidate);
  }
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  return n > 0 ? std::string(exe, static_cast<size_t>(n)) : a;
}

// The child, between fork and exec: only async-signal-safe calls. Closes
// every fd from 3 up but `keep` (sorted), which stay open across the exec.
[[noreturn]] void exec_child(const char* path, char* const* argv, char* const* envp, const int* keep,
                             size_t keep_n, int ready_fd) noexcept {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);  // this process blocks its signals for its signalfd
  ::signal(SIGPIPE, SIG_DFL);
  unsigned from = 3;
  for (size_t i = 0; i < keep_n; ++i) {
    const unsigned k = static_cast<unsigned>(keep[i]);
    if (k > from) ::close_range(from, k - 1, 0);
    if (k >= from) from = k + 1;
    ::fcntl(keep[i], F_SETFD, 0);
  }
  ::close_range(from, ~0u, 0);
  ::execve(path, argv, envp);
  char msg[1 + sizeof(int)];
  const int e = errno;
  msg[0] = 'E';
  std::memcpy(msg + 1, &e, sizeof e);
  [[maybe_unused]] ssize_t w = ::write(ready_fd, msg, sizeof msg);
  ::_exit(127);
}

}  // namespace

binary_upgrade::binary_upgrade(shard::reactor& r, int argc, char** argv) : _r(r) {
  _path = program_path(argc > 0 ? argv[0] : nullptr);
  for (int i = 0; i < argc; ++i) _args.emplace_back(argv[i]);
  _op.self = this;
  _op.fn = &binary_upgrade::on_read;
}

binary_upgrade::~binary_upgrade() {
  // The loop has ended: no SQE of ours is read any more.
  if (_ready_fd >= 0) ::close(_ready_fd);
}

bool binary_upgrade::start(const std::vector<passed_listener>& fds, uint64_t now_ms) {
  if (_state == state::waiting || _read_inflight) {
    log::warn("SIGUSR2: an upgrade is in progress (pid {}); ignored", _pid);
    return false;
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    log::error("SIGUSR2: pipe: {}; not upgrading", std::strerror(errno));
    return false;
  }
  std::string inherit = "SLUICE_INHERIT_FDS=";
  std::vector<int> keep{p[1]};
  for (const passed_listener& l : fds) {
    if (inherit.size() > sizeof "SLUICE_INHERIT_FDS=" - 1) inherit += ',';
    inherit += fmt::format("{}.{}={}", l.role, l.shard, l.fd);
    keep.push_back(l.fd);
  }
  std::sort(keep.begin(), keep.end());
  const std::string ready = fmt::format("SLUICE_READY_FD={}", p[1]);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!passed_by_upgrade(*e)) envp.push_back(*e);
  }
  envp.push_back(inherit.data());
  envp.push_back(const_cast<char*>(ready.c_str()));
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (std::string& a : _args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid == 0) exec_child(_path.c_str(), argv.data(), envp.data(), keep.data(), keep.size(), p[1]);
  ::close(p[1]);
  if (pid < 0) {
    log::error("SIGUSR2: fork: {}; not upgrading", std::strerror(errno));
    ::close(p[0]);
    return false;
  }
  if (_state == state::failed_reaping) log::warn("SIGUSR2: pid {} (the last failed upgrade) is not reaped", _pid);
  _pid = pid;
  _ready_fd = p[0];
  _state = state::waiting;
  _ready = false;
  _deadline_ms = now_ms + k_ready_timeout_ms;
  io_uring_sqe* s = _r.sqe(&_op);
  io_uring_prep_read(s, _ready_fd, _buf, sizeof _buf, 0);
  _read_inflight = true;
  log::info("SIGUSR2: started {} as pid {} with {} listening sockets; serving on until it is ready", _path, pid,
            fds.size());
  return true;
}

void binary_upgrade::on_read(shard::completion* c, const io_uring_cqe* cqe) {
  static_cast<read_op*>(c)->self->on_read_cqe(cqe->res);
}

void binary_upgrade::on_read_cqe(int res) noexcept {
  _read_inflight = false;
  if (_state == state::waiting && (res == -EINTR || res == -EAGAIN)) {
    io_uring_prep_read(_r.sqe(&_op), _ready_fd, _buf, sizeof _buf, 0);
    _read_inflight = true;
    return;
  }
  ::close(_ready_fd);
  _ready_fd = -1;
  if (_state != state::waiting) return;  // cancelled after the timeout: already failed
  if (res >= 1 && _buf[0] == 'R') {
    _ready = true;
    _state = state::idle;
    return;
  }
  if (res == static_cast<int>(1 + sizeof(int)) && _buf[0] == 'E') {
    int e = 0;
    std::memcpy(&e, _buf + 1, sizeof e);
    fail(fmt::format("could not be started: exec {}: {}", _path, std::strerror(e)));
  } else if (res >= 0) {
    fail("exited before it served");
  } else {
    fail(fmt::format("could not be watched: read: {}", std::strerror(-res)));
  }
}

void binary_upgrade::fail(std::string why) noexcept {
  log::error("SIGUSR2: the new process (pid {}) {}; this process serves on", _pid, why);
  _state = state::failed_reaping;
}

void binary_upgrade::reap(uint64_t) noexcept {
  int status = 0;
  const pid_t r = ::waitpid(_pid, &status, WNOHANG);
  if (r == 0) return;  // not exited yet (it closed the pipe as it exits)
  if (r == _pid && WIFEXITED(status)) {
    log::error("SIGUSR2: pid {} exited with status {}", _pid, WEXITSTATUS(status));
  } else if (r == _pid && WIFSIGNALED(status)) {
    log::error("SIGUSR2: pid {} was killed by signal {}", _pid, WTERMSIG(status));
  }
  _state = state::idle;
  _pid = -1;
}

bool binary_upgrade::on_iteration(uint64_t now_ms) {
  if (_state == state::failed_reaping) reap(now_ms);
  if (_state == state::waiting && now_ms >= _deadline_ms) {
    ::kill(_pid, SIGKILL);
    fail(fmt::format("did not say it serves within {} ms: killed", k_ready_timeout_ms));
    if (_read_inflight) io_uring_prep_cancel(_r.sqe_untracked(), &_op, 0);
  }
  if (!_ready) return false;
  _ready = false;
  return true;
}

void binary_upgrade::signal_ready() {
  const char* v = std::getenv("SLUICE_READY_FD");
  // Started by systemd (or by hand), not by an upgrade: the service is up.
  // The new process of an upgrade is not the main one systemd knows yet;
  // the old one names it once this byte arrives (MAINPID=).
  if (v == nullptr) {
    service_notify("READY=1");
    return;
  }
  int fd = -1;
  const std::string s(v);
  ::unsetenv("SLUICE_READY_FD");
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), fd);
  if (ec != std::errc() || end != s.data() + s.size() || fd < 3) {
    log::warn("SLUICE_READY_FD: ignoring \"{}\"", s);
    return;
  }
  const char ready = 'R';
  if (::write(fd, &ready, 1) != 1) log::warn("SLUICE_READY_FD: write: {}", std::strerror(errno));
  ::close(fd);
}

}  // namespace sluice::control
