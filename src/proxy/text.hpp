#pragma once
// proxy (private): small helpers shared by the downstream and upstream code.
#include <liburing.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace sluice::proxy {

// ASCII case-insensitive equality (HTTP field names).
inline bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x + 32);
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y + 32);
    if (x != y) return false;
  }
  return true;
}

// Drops the first `sent` bytes from an iovec array in place (after a short
// send). Returns: whether bytes remain to be sent.
inline bool advance_iov(iovec* iov, uint8_t& count, size_t sent) noexcept {
  uint8_t i = 0;
  while (i < count && sent >= iov[i].iov_len) {
    sent -= iov[i].iov_len;
    ++i;
  }
  if (i == count) {
    count = 0;
    return false;
  }
  uint8_t k = 0;
  for (uint8_t j = i; j < count; ++j) iov[k++] = iov[j];
  iov[0].iov_base = static_cast<char*>(iov[0].iov_base) + sent;
  iov[0].iov_len -= sent;
  count = k;
  return true;
}

// Prepares the send of iov[0..count): one piece is a plain send, without
// the msghdr and iovec the kernel would copy in; more go as a sendmsg of
// `msg` (which must live until the completion).
inline void prep_send_iov(io_uring_sqe* s, int fd, iovec* iov, uint8_t count, msghdr& msg) noexcept {
  if (count == 1) {
    io_uring_prep_send(s, fd, iov[0].iov_base, iov[0].iov_len, MSG_NOSIGNAL);
    return;
  }
  msg = msghdr{};
  msg.msg_iov = iov;
  msg.msg_iovlen = count;
  io_uring_prep_sendmsg(s, fd, &msg, MSG_NOSIGNAL);
}

}  // namespace sluice::proxy
