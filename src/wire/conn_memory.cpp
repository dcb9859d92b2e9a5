// The connection buffers and their count against the shard's connection
// memory (server.memory_max_bytes).
#include "conn_memory.hpp"

#include <cstdlib>

namespace sluice::proxy {

namespace {
thread_local int64_t t_connection_memory = 0;
}  // namespace

int64_t connection_memory_bytes() noexcept { return t_connection_memory; }
void account_connection_memory(int64_t delta) noexcept { t_connection_memory += delta; }

byte_buf::~byte_buf() { release(); }

bool byte_buf::reserve(size_t n) noexcept {
  if (n <= cap) return true;
  if (n > (1u << 30)) return false;
  // 1 KiB first: a request head, a response head and most chat bodies fit;
  // an idle stream then holds ~3 KiB of buffers, not ~12.
  size_t next = cap == 0 ? 1024 : cap;
  while (next < n) next *= 2;
  void* p = std::realloc(data, next);
  if (p == nullptr) return false;
  data = static_cast<char*>(p);
  t_connection_memory += static_cast<int64_t>(next) - cap;
  cap = static_cast<uint32_t>(next);
  return true;
}

void byte_buf::release() noexcept {
  t_connection_memory -= cap;
  std::free(data);
  data = nullptr;
  len = cap = 0;
}

}  // namespace sluice::proxy
