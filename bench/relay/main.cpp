// bench-relay: the floor an HTTP proxy is measured against (bench/compare's
// "relay" target). A plain L4 relay on io_uring: accept, connect once per
// client connection to the backend, copy bytes both ways, parse nothing.
// Whatever a proxy spends above this on the same load is the price of what
// it does with the bytes (HTTP, JSON, routing, quota, audit).
//
//   bench-relay --listen PORT --backend HOST:PORT [--threads N] [--cpus LIST]
//
// PORT 0: an ephemeral port, printed in the "listening on" line.
// One thread per --threads, each with its own ring and its own SO_REUSEPORT
// listener (as sluice's shards, nginx's workers); --cpus pins thread i to
// the i-th CPU of the list. Per connection pair two buffers of 64 KiB, one
// per direction: a receive into a buffer is followed by sends of exactly
// what came, and only then the next receive (no copy, no queue). Either
// side closing or failing closes both. Stops on SIGTERM / SIGINT.
//
// Lifetimes: a buffer is the kernel's from the SQE that names it until its
// CQE; a pair is freed only when none of its operations is in flight
// (`ops`, asserted), after both sockets are closed.
#include <arpa/inet.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t k_buffer = 64 * 1024;
constexpr unsigned k_ring_entries = 4096;

std::atomic<bool> g_stop{false};

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "bench-relay: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

#define RELAY_ASSERT(c)                                                                   \
  do {                                                                                    \
    if (!(c)) {                                                                           \
      std::fprintf(stderr, "bench-relay: %s:%d: assertion %s failed\n", __FILE__, __LINE__, #c); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

struct pair;

// What a CQE completes: the op's kind and its pair (user_data points here).
enum class op_kind : uint8_t { accept, connect, recv, send, close };
struct op {
  op_kind kind;
  uint8_t dir = 0;  // recv/send: 0 client -> backend, 1 backend -> client
  pair* p = nullptr;
};

// One client connection and its backend connection.
struct pair {
  int fd[2] = {-1, -1};  // 0 client, 1 backend
  // dir d: received from fd[d], sent to fd[1 - d].
  char* buf[2] = {nullptr, nullptr};
  uint32_t len[2] = {0, 0};   // bytes in buf[d] not yet sent
  uint32_t sent[2] = {0, 0};  // of them, sent
  bool in_kernel[2] = {false, false};  // buf[d] named by an SQE whose CQE has not come
  op recv_op[2], send_op[2], connect_op, close_op[2];
  int ops = 0;  // operations in flight
  bool closing = false;
  int closes_left = 0;
};

struct worker {
  io_uring ring{};
  int listen_fd = -1;
  sockaddr_in backend{};
  op accept_op{op_kind::accept};

  io_uring_sqe* sqe() {
    io_uring_sqe* s = io_uring_get_sqe(&ring);
    if (s == nullptr) {
      io_uring_submit(&ring);
      s = io_uring_get_sqe(&ring);
      RELAY_ASSERT(s != nullptr);
    }
    return s;
  }

  void arm_accept() {
    io_uring_sqe* s = sqe();
    io_uring_prep_multishot_accept(s, listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    io_uring_sqe_set_data(s, &accept_op);
  }

  void arm_recv(pair* p, int d) {
    RELAY_ASSERT(!p->in_kernel[d] && p->len[d] == 0);
    p->in_kernel[d] = true;
    ++p->ops;
    io_uring_sqe* s = sqe();
    io_uring_prep_recv(s, p->fd[d], p->buf[d], k_buffer, 0);
    io_uring_sqe_set_data(s, &p->recv_op[d]);
  }

  void arm_send(pair* p, int d) {
    RELAY_ASSERT(!p->in_kernel[d] && p->sent[d] < p->len[d]);
    p->in_kernel[d] = true;
    ++p->ops;
    io_uring_sqe* s = sqe();
    io_uring_prep_send(s, p->fd[1 - d], p->buf[d] + p->sent[d], p->len[d] - p->sent[d], MSG_NOSIGNAL);
    io_uring_sqe_set_data(s, &p->send_op[d]);
  }

  void start_pair(int client) {
    const int one = 1;
    ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const int up = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (up < 0) {
      ::close(client);
      return;
    }
    ::setsockopt(up, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto* p = new pair;
    p->fd[0] = client;
    p->fd[1] = up;
    for (int d = 0; d < 2; ++d) {
      p->buf[d] = static_cast<char*>(std::malloc(k_buffer));
      RELAY_ASSERT(p->buf[d] != nullptr);
      p->recv_op[d] = {op_kind::recv, static_cast<uint8_t>(d), p};
      p->send_op[d] = {op_kind::send, static_cast<uint8_t>(d), p};
      p->close_op[d] = {op_kind::close, static_cast<uint8_t>(d), p};
    }
    p->connect_op = {op_kind::connect, 0, p};
    ++p->ops;
    io_uring_sqe* s = sqe();
    io_uring_prep_connect(s, up, reinterpret_cast<const sockaddr*>(&backend), sizeof backend);
    io_uring_sqe_set_data(s, &p->connect_op);
  }

  // Both sockets shut down: what is in flight completes with an error or
  // 0 and the pair is closed once nothing of it is in the kernel.
  void fail(pair* p) {
    if (p->closing) return;
    p->closing = true;
    for (int d = 0; d < 2; ++d) ::shutdown(p->fd[d], SHUT_RDWR);
    maybe_close(p);
  }

  void maybe_close(pair* p) {
    if (!p->closing || p->ops != 0 || p->closes_left != 0) return;
    p->closes_left = 2;
    for (int d = 0; d < 2; ++d) {
      ++p->ops;
      io_uring_sqe* s = sqe();
      io_uring_prep_close(s, p->fd[d]);
      io_uring_sqe_set_data(s, &p->close_op[d]);
    }
  }

  void free_pair(pair* p) {
    RELAY_ASSERT(p->ops == 0 && !p->in_kernel[0] && !p->in_kernel[1]);
    std::free(p->buf[0]);
    std::free(p->buf[1]);
    delete p;
  }

  void on_cqe(io_uring_cqe* c) {
    op* o = static_cast<op*>(io_uring_cqe_get_data(c));
    const int res = c->res;
    if (o->kind == op_kind::accept) {
      if (res >= 0) start_pair(res);
      if (!(c->flags & IORING_CQE_F_MORE) && !g_stop.load(std::memory_order_relaxed)) arm_accept();
      return;
    }
    pair* p = o->p;
    --p->ops;
    switch (o->kind) {
      case op_kind::connect:
        if (res < 0 || p->closing) {
          fail(p);
        } else {
          arm_recv(p, 0);
          arm_recv(p, 1);
        }
        break;
      case op_kind::recv: {
        const int d = o->dir;
        p->in_kernel[d] = false;
        if (res <= 0 || p->closing) {
          fail(p);
          break;
        }
        p->len[d] = static_cast<uint32_t>(res);
        p->sent[d] = 0;
        arm_send(p, d);
        break;
      }
      case op_kind::send: {
        const int d = o->dir;
        p->in_kernel[d] = false;
        if (res <= 0 || p->closing) {
          fail(p);
          break;
        }
        p->sent[d] += static_cast<uint32_t>(res);
        if (p->sent[d] < p->len[d]) {
          arm_send(p, d);  // a short send: the rest
        } else {
          p->len[d] = p->sent[d] = 0;
          arm_recv(p, d);
        }
        break;
      }
      case op_kind::close:
        if (--p->closes_left == 0 && p->ops == 0) {
          free_pair(p);
          return;
        }
        break;
      case op_kind::accept: break;
    }
    if (p->closing) maybe_close(p);
  }

  void run() {
    arm_accept();
    while (!g_stop.load(std::memory_order_relaxed)) {
      __kernel_timespec ts{0, 200'000'000};  // wake to see a stop
      io_uring_cqe* c = nullptr;
      const int r = io_uring_submit_and_wait_timeout(&ring, &c, 1, &ts, nullptr);
      if (r < 0 && r != -ETIME && r != -EINTR) {
        errno = -r;
        die("io_uring_submit_and_wait_timeout");
      }
      unsigned head, seen = 0;
      io_uring_for_each_cqe(&ring, head, c) {
        on_cqe(c);
        ++seen;
      }
      io_uring_cq_advance(&ring, seen);
    }
  }
};

std::vector<int> parse_cpus(const std::string& s) {
  std::vector<int> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string part = s.substr(i, j - i);
    const size_t dash = part.find('-');
    const int a = std::atoi(part.c_str());
    const int b = dash == std::string::npos ? a : std::atoi(part.c_str() + dash + 1);
    for (int c = a; c <= b; ++c) out.push_back(c);
    i = j + 1;
  }
  return out;
}

void usage(int code) {
  std::fputs(
      "usage: bench-relay --listen PORT --backend HOST:PORT [--threads N] [--cpus LIST]\n"
      "  A plain L4 relay on io_uring (no parsing): the floor bench/compare measures\n"
      "  proxies against. --threads: rings, one SO_REUSEPORT listener each (default 1);\n"
      "  --cpus: pin thread i to the i-th CPU of LIST (e.g. 1 or 0-3).\n",
      code == 0 ? stdout : stderr);
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  int port = -1, threads = 1;
  std::string backend, cpus;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(2);
      return argv[++i];
    };
    if (a == "--listen") {
      port = std::atoi(value().c_str());
    } else if (a == "--backend") {
      backend = value();
    } else if (a == "--threads") {
      threads = std::atoi(value().c_str());
    } else if (a == "--cpus") {
      cpus = value();
    } else if (a == "--help" || a == "-h") {
      usage(0);
    } else {
      usage(2);
    }
  }
  const size_t colon = backend.rfind(':');
  if (port < 0 || port > 65535 || colon == std::string::npos || threads < 1) usage(2);
  sockaddr_in up{};
  up.sin_family = AF_INET;
  up.sin_port = htons(static_cast<uint16_t>(std::atoi(backend.c_str() + colon + 1)));
  if (::inet_pton(AF_INET, backend.substr(0, colon).c_str(), &up.sin_addr) != 1) usage(2);
  const std::vector<int> cpu_list = parse_cpus(cpus);

  struct sigaction sa{};
  sa.sa_handler = [](int) { g_stop.store(true); };
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  std::vector<worker> workers(static_cast<size_t>(threads));
  for (worker& w : workers) {
    w.backend = up;
    w.listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (w.listen_fd < 0) die("socket");
    const int one = 1;
    ::setsockopt(w.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ::setsockopt(w.listen_fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(w.listen_fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) die("bind");
    if (::listen(w.listen_fd, 4096) != 0) die("listen");
    if (port == 0) {  // an ephemeral port: the first listener's, for the rest too
      socklen_t len = sizeof a;
      if (::getsockname(w.listen_fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) die("getsockname");
      port = ntohs(a.sin_port);
    }
  }
  std::vector<std::thread> running;
  for (size_t i = 0; i < workers.size(); ++i) {
    running.emplace_back([&, i] {
      if (!cpu_list.empty()) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu_list[i % cpu_list.size()], &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set);
      }
      // The ring is made by the thread that submits to it (SINGLE_ISSUER).
      io_uring_params params{};
      params.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
      if (io_uring_queue_init_params(k_ring_entries, &workers[i].ring, &params) < 0) {
        params = {};
        params.flags = IORING_SETUP_COOP_TASKRUN;
        const int r = io_uring_queue_init_params(k_ring_entries, &workers[i].ring, &params);
        if (r < 0) {
          errno = -r;
          die("io_uring_queue_init");
        }
      }
      workers[i].run();
    });
  }
  std::printf("bench-relay listening on 127.0.0.1:%d -> %s (%d thread%s)\n", port, backend.c_str(), threads,
              threads == 1 ? "" : "s");
  std::fflush(stdout);
  for (std::thread& t : running) t.join();
  return 0;
}
