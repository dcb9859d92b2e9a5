// mock-vllm: flags, listeners, one worker thread per --threads, and a main
// thread that waits for SIGTERM/SIGINT.
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "options.hpp"
#include "state.hpp"
#include "worker.hpp"

namespace {

// Thousands of idle streams need more descriptors than the usual soft limit.
void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

}  // namespace

int main(int argc, char** argv) {
  mock_vllm::options opts;
  std::string error;
  switch (mock_vllm::parse_flags(argc, argv, opts, error)) {
    case mock_vllm::parse_outcome::help:
      std::fwrite(mock_vllm::help_text().data(), 1, mock_vllm::help_text().size(), stdout);
      return 0;
    case mock_vllm::parse_outcome::error:
      std::fprintf(stderr, "mock-vllm: %s\n", error.c_str());
      return 2;
    case mock_vllm::parse_outcome::run: break;
  }
  raise_fd_limit();

  // Block the stop signals before any thread starts, so that only sigwait()
  // below receives them; writes to a closed socket must not kill us.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  // Every loop gets its own SO_REUSEPORT listener on the same port; with
  // --port 0 the first one picks the port for the rest.
  std::vector<int> listeners;
  uint16_t port = opts.port;
  for (uint32_t i = 0; i < opts.threads; ++i) {
    int fd = mock_vllm::open_listener(opts.host, port, error);
    if (fd < 0) {
      std::fprintf(stderr, "mock-vllm: %s\n", error.c_str());
      return 1;
    }
    port = static_cast<uint16_t>(mock_vllm::bound_port(fd));
    listeners.push_back(fd);
  }

  auto state = std::make_unique<mock_vllm::shared_state>();
  std::vector<std::unique_ptr<mock_vllm::worker>> workers;
  for (uint32_t i = 0; i < opts.threads; ++i) {
    workers.push_back(std::make_unique<mock_vllm::worker>(opts, *state, listeners[i], i));
  }
  std::vector<std::thread> threads;
  for (auto& w : workers) threads.emplace_back([&w] { w->run(); });

  bool v6 = opts.host.find(':') != std::string::npos;
  std::printf("mock-vllm listening on http://%s%s%s:%u\n", v6 ? "[" : "", opts.host.c_str(), v6 ? "]" : "",
              static_cast<unsigned>(port));
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  // Nothing to drain: a mock's in-flight replies may be cut. _exit skips the
  // destructors of objects the running loops still use.
  std::fflush(stdout);
  _exit(0);
}
