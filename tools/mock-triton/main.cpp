// mock-triton: flags, the listener, the event loop on its own thread, and a
// main thread that waits for SIGTERM/SIGINT.
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include <unistd.h>

#include "options.hpp"
#include "server.hpp"
#include "worker.hpp"  // mock-vllm's open_listener and bound_port

int main(int argc, char** argv) {
  mock_triton::options opts;
  std::string error;
  switch (mock_triton::parse_flags(argc, argv, opts, error)) {
    case mock_triton::parse_outcome::help:
      std::fwrite(mock_triton::help_text().data(), 1, mock_triton::help_text().size(), stdout);
      return 0;
    case mock_triton::parse_outcome::error:
      std::fprintf(stderr, "mock-triton: %s\n", error.c_str());
      return 2;
    case mock_triton::parse_outcome::run: break;
  }
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  int fd = mock_vllm::open_listener(opts.host, opts.port, error);
  if (fd < 0) {
    std::fprintf(stderr, "mock-triton: %s\n", error.c_str());
    return 1;
  }
  int port = mock_vllm::bound_port(fd);
  auto* loop = new mock_triton::server(opts, fd);  // lives until _exit
  std::thread thread([loop] { loop->run(); });
  thread.detach();

  bool v6 = opts.host.find(':') != std::string::npos;
  std::printf("mock-triton listening on grpc://%s%s%s:%d\n", v6 ? "[" : "", opts.host.c_str(), v6 ? "]" : "", port);
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  // Nothing to drain: a mock's streams may be cut. _exit skips the
  // destructors of what the loop still uses.
  std::fflush(stdout);
  _exit(0);
}
