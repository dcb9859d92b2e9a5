#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include "sluice/net/pipe_pool.hpp"

using sluice::net::pipe_fds;
using sluice::net::pipe_pool;

namespace {
bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }
}  // namespace

TEST_SUITE("net::pipe_pool") {
  TEST_CASE("the pool hands out at most max_pipes pipes at once") {
    pipe_pool pool(2);
    pipe_fds a = pool.acquire();
    pipe_fds b = pool.acquire();
    pipe_fds c = pool.acquire();
    CHECK(a.valid());
    CHECK(b.valid());
    CHECK_FALSE(c.valid());
    CHECK(pool.in_use() == 2);
    pool.release(a, true);
    pipe_fds d = pool.acquire();
    CHECK(d.valid());
    pool.release(b, true);
    pool.release(d, true);
    CHECK(pool.in_use() == 0);
  }

  TEST_CASE("an empty released pipe is reused, a non-empty one is closed") {
    pipe_pool pool(8);
    pipe_fds a = pool.acquire();
    pool.release(a, true);
    CHECK(pool.idle() == 1);
    pipe_fds again = pool.acquire();
    CHECK(again.read_fd == a.read_fd);
    CHECK(::write(again.write_fd, "x", 1) == 1);
    pool.release(again, false);
    CHECK(pool.idle() == 0);
    CHECK_FALSE(is_open(a.read_fd));
  }

  TEST_CASE("pipes are non-blocking, so a splice never parks a worker") {
    pipe_pool pool(1);
    pipe_fds a = pool.acquire();
    CHECK((::fcntl(a.read_fd, F_GETFL) & O_NONBLOCK) != 0);
    CHECK((::fcntl(a.write_fd, F_GETFL) & O_NONBLOCK) != 0);
    char c;
    CHECK(::read(a.read_fd, &c, 1) == -1);
    pool.release(a, true);
  }
}
