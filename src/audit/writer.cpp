#include "sluice/audit/writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"

namespace sluice::audit {
namespace {

int open_log(const std::string& path) noexcept {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
}

}  // namespace

writer::writer(shard::reactor& r, std::string path, const options& o) : _r(r), _path(std::move(path)), _opt(o) {
  _op.self = this;
  _op.fn = &writer::on_write;
}

std::unique_ptr<writer> writer::open(shard::reactor& r, std::string path, const options& o) {
  options opt = o;
  // A buffer must hold the longest possible line, or a record could never fit.
  if (opt.buffer_bytes < max_line_bytes) opt.buffer_bytes = max_line_bytes;
  std::unique_ptr<writer> w(new writer(r, std::move(path), opt));
  w->_fd = open_log(w->_path);
  if (w->_fd < 0) {
    log::error("audit: cannot open {}: {}", w->_path, std::strerror(errno));
    return nullptr;
  }
  if (opt.max_buffer_bytes < opt.buffer_bytes) opt.max_buffer_bytes = opt.buffer_bytes;
  w->_opt = opt;
  for (batch& b : w->_batches) {
    b.data.reset(new char[opt.buffer_bytes]);
    b.cap = opt.buffer_bytes;
  }
  w->_now_ms = r.now_ms();
  return w;
}

writer::~writer() {
  if (!_closed) close();
  // A write still in flight points at our buffers and at _op: wait for it,
  // however long the disk takes (close() gave up at its timeout).
  while (_inflight) _r.run_once(100);
}

bool writer::idle() const noexcept { return !_inflight && _batches[_filling].len == 0; }

bool writer::append(const record& rec) noexcept {
  if (SLUICE_UNLIKELY(_closed || _fd < 0)) {
    _stats.lines_dropped.add();
    return false;
  }
  batch* b = &_batches[_filling];
  size_t n = format_line(rec, b->data.get() + b->len, b->cap - b->len);
  if (n == 0) {
    // The filling batch is full. Hand it over if the kernel is done with the
    // other one; otherwise grow it (a burst), and drop only past the bound.
    SLUICE_ASSERT(b->len > 0);
    if (_inflight) {
      if (!grow(*b)) {
        _stats.lines_dropped.add();
        if (!_drop_logged) {
          _drop_logged = true;
          log::warn("audit: shard {}: both batch buffers busy at {} bytes, dropping records (counted in stats)",
                    _opt.shard, _opt.max_buffer_bytes);
        }
        return false;
      }
      n = format_line(rec, b->data.get() + b->len, b->cap - b->len);
    } else {
      start_batch();
      b = &_batches[_filling];
      n = format_line(rec, b->data.get(), b->cap);
    }
    SLUICE_VERIFY(n > 0);  // max_line_bytes bounds every line
  }
  if (b->len == 0) _batch_started_ms = _now_ms;
  b->len += n;
  ++b->lines;
  _stats.lines_appended.add();
  // Nearly full: write now rather than wait for the timer, so the other
  // buffer is free again by the time this one runs out.
  if (b->cap - b->len < max_line_bytes && !_inflight) start_batch();
  return true;
}

bool writer::grow(batch& b) noexcept {
  const size_t next = b.cap * 2 < _opt.max_buffer_bytes ? b.cap * 2 : _opt.max_buffer_bytes;
  if (next - b.len < max_line_bytes) return false;
  std::unique_ptr<char[]> bigger(new (std::nothrow) char[next]);
  if (!bigger) return false;
  std::memcpy(bigger.get(), b.data.get(), b.len);
  b.data = std::move(bigger);
  b.cap = next;
  _stats.buffer_grows.add();
  return true;
}

void writer::tick(uint64_t now_ms) noexcept {
  _now_ms = now_ms;
  if (_inflight || _batches[_filling].len == 0) return;
  if (now_ms - _batch_started_ms >= _opt.flush_interval_ms) start_batch();
}

void writer::flush() noexcept {
  if (!_inflight && _batches[_filling].len > 0) start_batch();
}

// The filling batch goes to the kernel; the other (free) one starts filling.
void writer::start_batch() noexcept {
  SLUICE_ASSERT(!_inflight);
  batch& b = _batches[_filling];
  b.written = 0;
  b.fd = _fd;
  _inflight = true;
  _filling ^= 1u;
  SLUICE_ASSERT(_batches[_filling].len == 0);
  submit_write();
}

void writer::submit_write() noexcept {
  const batch& b = _batches[_filling ^ 1u];
  io_uring_sqe* s = _r.sqe(&_op);
  // Offset -1: "the current file position" (IORING_FEAT_RW_CUR_POS, Linux
  // 5.6); with O_APPEND the kernel places the bytes at end-of-file under the
  // inode lock, which is what keeps whole batches from shards apart.
  io_uring_prep_write(s, b.fd, b.data.get() + b.written, static_cast<unsigned>(b.len - b.written),
                      static_cast<uint64_t>(-1));
  // IOSQE_ASYNC (Linux 5.6): skip the inline non-blocking attempt and write
  // from an io-wq worker as a blocking write. A non-blocking buffered write
  // (xfs, btrfs support it) may stop part-way when it would block, and
  // io_uring then issues the rest as a second write — another shard's batch
  // could land in between and tear a line. A blocking write holds the inode
  // lock for all of it. The worker hop costs little at one write per batch.
  s->flags |= IOSQE_ASYNC;
}

void writer::on_write(shard::completion* c, const io_uring_cqe* cqe) {
  writer* self = static_cast<write_op*>(c)->self;
  batch& b = self->_batches[self->_filling ^ 1u];
  SLUICE_ASSERT(self->_inflight);
  const int res = cqe->res;
  if (res == -EINTR || res == -EAGAIN) {  // nothing written: try again
    self->submit_write();
    return;
  }
  if (res <= 0) {
    // EIO, ENOSPC, EFBIG, EDQUOT, EBADF…; 0 for a non-empty write would loop
    // forever, so it counts as an error too. The batch is lost (counted).
    self->_stats.write_errors.add();
    if (!self->_error_logged) {
      self->_error_logged = true;
      log::error("audit: shard {}: write to {} failed: {} (further errors only counted)", self->_opt.shard,
                 self->_path, res == 0 ? "wrote nothing" : std::strerror(-res));
    }
    self->finish_batch(0, b.lines);
    return;
  }
  b.written += static_cast<size_t>(res);
  self->_stats.bytes_written.add(static_cast<uint64_t>(res));
  if (b.written < b.len) {
    // A short write on a regular file means the disk or a limit is full; the
    // rest goes out before any later batch of this shard.
    self->_stats.short_writes.add();
    self->submit_write();
    return;
  }
  self->finish_batch(b.lines, 0);
}

void writer::finish_batch(uint64_t lines_ok, uint64_t lines_bad) noexcept {
  batch& b = _batches[_filling ^ 1u];
  _stats.lines_written.add(lines_ok);
  _stats.lines_lost.add(lines_bad);
  _stats.batches_written.add();
  const int fd = b.fd;
  b.len = 0;
  b.written = 0;
  b.lines = 0;
  b.fd = -1;
  _inflight = false;
  // Rotated while this batch was in the kernel: its file is ours to close now.
  if (fd != _fd) release_fd(fd);
  // A batch that filled up meanwhile should not wait for the next tick.
  const batch& f = _batches[_filling];
  if (!_closed && f.len > 0 && (f.cap - f.len < max_line_bytes || _closing)) start_batch();
}

void writer::release_fd(int fd) noexcept {
  if (fd >= 0) ::close(fd);
}

bool writer::reopen() noexcept {
  if (_closed) return false;
  const int fd = open_log(_path);
  _stats.reopens.add();
  if (fd < 0) {
    _stats.reopen_errors.add();
    log::error("audit: shard {}: reopen of {} failed: {}; still writing to the old file", _opt.shard, _path,
               std::strerror(errno));
    return false;
  }
  const int old = _fd;
  _fd = fd;
  // The batch in flight (if any) keeps the old fd until its CQE; otherwise
  // nothing references it any more.
  const bool old_in_use = _inflight && _batches[_filling ^ 1u].fd == old;
  if (!old_in_use) release_fd(old);
  _error_logged = false;  // a new file: report its first failure too
  return true;
}

bool writer::flush_and_wait(uint32_t timeout_ms) noexcept {
  _closing = true;
  _r.run_once(0);
  const uint64_t start_ms = _r.now_ms();
  for (;;) {
    flush();
    if (idle()) break;
    if (_r.now_ms() - start_ms >= timeout_ms) break;
    _r.run_once(10);
  }
  _closing = false;
  if (!idle()) {
    log::error("audit: shard {}: flush of {} did not finish within {} ms", _opt.shard, _path, timeout_ms);
    return false;
  }
  return true;
}

bool writer::close(uint32_t timeout_ms) noexcept {
  if (_closed) return idle();
  const bool ok = flush_and_wait(timeout_ms);
  _closed = true;
  // A write still in flight keeps the fd; finish_batch closes it.
  if (_fd >= 0 && !(_inflight && _batches[_filling ^ 1u].fd == _fd)) release_fd(_fd);
  _fd = -1;
  return ok;
}

}  // namespace sluice::audit
