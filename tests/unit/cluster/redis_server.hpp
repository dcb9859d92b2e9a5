#pragma once
// A real redis-server for the cluster tests: started on a free loopback port
// with no persistence, stopped by the destructor (a failed REQUIRE
// included) or, should the test process die, by PR_SET_PDEATHSIG.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <hiredis/hiredis.h>

namespace sluice::test {

inline constexpr const char* k_redis_server = "/usr/bin/redis-server";

// A port nothing listens on right now (the kernel's pick for port 0).
inline uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class redis_server {
 public:
  explicit redis_server(std::string password = {}) : _password(std::move(password)), _port(free_port()) {}
  ~redis_server() { stop(); }
  redis_server(const redis_server&) = delete;
  redis_server& operator=(const redis_server&) = delete;

  uint16_t port() const { return _port; }
  const std::string& password() const { return _password; }

  // Returns: whether it answers PING within 5 s.
  bool start() {
    stop();
    _pid = ::fork();
    if (_pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
      std::string port = std::to_string(_port);
      std::vector<const char*> argv = {k_redis_server, "--port", port.c_str(), "--bind", "127.0.0.1",
                                       "--save", "", "--appendonly", "no"};
      if (!_password.empty()) {
        argv.push_back("--requirepass");
        argv.push_back(_password.c_str());
      }
      argv.push_back(nullptr);
      ::execv(k_redis_server, const_cast<char* const*>(argv.data()));
      ::_exit(127);
    }
    for (int i = 0; i < 100; ++i) {
      redisReply* r = command({"PING"});
      const bool pong = r != nullptr && r->type == REDIS_REPLY_STATUS;
      if (r != nullptr) freeReplyObject(r);
      if (pong) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  void stop() {
    if (_pid <= 0) return;
    ::kill(_pid, SIGCONT);
    ::kill(_pid, SIGKILL);
    ::waitpid(_pid, nullptr, 0);
    _pid = -1;
  }
  void pause() { ::kill(_pid, SIGSTOP); }
  void resume() { ::kill(_pid, SIGCONT); }

  // A blocking command on a connection of its own (tests only). Returns:
  // the reply (the caller frees it), or nullptr when Redis did not answer.
  redisReply* command(std::vector<std::string> args) {
    timeval tv{1, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", _port, tv);
    if (c == nullptr || c->err != 0) {
      if (c != nullptr) redisFree(c);
      return nullptr;
    }
    redisSetTimeout(c, tv);
    if (!_password.empty()) {
      auto* a = static_cast<redisReply*>(redisCommand(c, "AUTH %s", _password.c_str()));
      if (a != nullptr) freeReplyObject(a);
    }
    std::vector<const char*> ptrs;
    std::vector<size_t> lens;
    for (const std::string& s : args) {
      ptrs.push_back(s.data());
      lens.push_back(s.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(args.size()), ptrs.data(), lens.data()));
    redisFree(c);
    return r;
  }

  // Returns: the integer reply of `args`, or INT64_MIN.
  long long integer(std::vector<std::string> args) {
    redisReply* r = command(std::move(args));
    long long v = r != nullptr && r->type == REDIS_REPLY_INTEGER ? r->integer : INT64_MIN;
    if (r != nullptr) freeReplyObject(r);
    return v;
  }

 private:
  std::string _password;
  uint16_t _port;
  pid_t _pid = -1;
};

}  // namespace sluice::test
