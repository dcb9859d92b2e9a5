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
  _write_op.self = this;
  _write_op.fn = &writer::on_write;
  _sync_op.self = this;
  _sync_op.fn = &writer::on_sync;
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
  // A zero backoff would retry a failing disk in a busy loop.
  if (opt.retry_backoff_ms == 0) opt.retry_backoff_ms = 1;
  if (opt.retry_backoff_max_ms < opt.retry_backoff_ms) opt.retry_backoff_max_ms = opt.retry_backoff_ms;
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
    // The filling batch is full. Hand it over if the other one is written;
    // otherwise grow it (a burst, or the other batch waiting for a retry of
    // a failed write), and drop only past the bound: that is the one place
    // a failing disk costs records, and they are counted in lines_dropped.
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
      pump();
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
  if (b->cap - b->len < max_line_bytes && !_inflight) pump();
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
  pump();
}

void writer::flush() noexcept {
  if (!_inflight && _fd >= 0 && _batches[_filling].len > 0) start_batch();
  pump();
}

// The filling batch is handed over (pump writes it); the other (free) one
// starts filling.
void writer::start_batch() noexcept {
  SLUICE_ASSERT(!_inflight);
  batch& b = _batches[_filling];
  b.written = 0;
  b.fd = _fd;
  _inflight = true;
  _filling ^= 1u;
  SLUICE_ASSERT(_batches[_filling].len == 0);
}

void writer::pump() noexcept {
  if (_closed || _writing || _syncing) return;
  batch& p = pending();
  // Nothing of it on its file yet (it waits for a retry, and SIGUSR1 came
  // meanwhile): it goes to the current file, which may well be healthy.
  if (_inflight && p.written == 0 && p.fd != _fd && _fd >= 0) {
    const int old = p.fd;
    p.fd = _fd;
    release_fd(old);
  }
  const batch& f = _batches[_filling];
  const bool nothing_left = !_inflight && f.len == 0;
  const int next_fd = _inflight ? p.fd : _fd;
  // The fsync first when it is due, or when the next write goes to another
  // file (after a reopen: the rotated file is made durable, once, and only
  // one file is ever unsynced); at shutdown once everything is written.
  if (_dirty_fd >= 0 && (_dirty_fd != next_fd || _now_ms - _dirty_since_ms >= _opt.fsync_interval_ms ||
                         (_closing && nothing_left))) {
    submit_sync();
    return;
  }
  if (_inflight) {
    if (_now_ms >= _retry_at_ms) submit_write();
    return;
  }
  if (f.len == 0 || _fd < 0) return;
  if (f.cap - f.len < max_line_bytes || _closing || _now_ms - _batch_started_ms >= _opt.flush_interval_ms) {
    start_batch();
    submit_write();
  }
}

void writer::submit_write() noexcept {
  const batch& b = pending();
  SLUICE_ASSERT(_inflight && !_writing && !_syncing);
  _writing = true;
  io_uring_sqe* s = _r.sqe(&_write_op);
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

void writer::submit_sync() noexcept {
  SLUICE_ASSERT(_dirty_fd >= 0 && !_writing && !_syncing);
  _syncing = true;
  _sync_fd = _dirty_fd;
  _dirty_fd = -1;  // bytes written from now on need the next fsync
  io_uring_sqe* s = _r.sqe(&_sync_op);
  // fdatasync: an append-only file needs its data and its size, not its
  // timestamps. IORING_OP_FSYNC (Linux 5.1) runs in an io-wq worker.
  io_uring_prep_fsync(s, _sync_fd, IORING_FSYNC_DATASYNC);
}

void writer::on_write(shard::completion* c, const io_uring_cqe* cqe) {
  writer* self = static_cast<op*>(c)->self;
  batch& b = self->pending();
  SLUICE_ASSERT(self->_inflight && self->_writing);
  self->_writing = false;
  const int res = cqe->res;
  if (res == -EINTR || res == -EAGAIN) {  // nothing written: try again
    self->submit_write();
    return;
  }
  if (res <= 0) {
    // EIO, ENOSPC, EFBIG, EDQUOT, EBADF…; 0 for a non-empty write would loop
    // forever, so it counts as an error too. A failed write wrote nothing:
    // the batch goes again from b.written after the backoff.
    self->write_failed(res);
    self->pump();
    return;
  }
  if (self->_failures > 0) {
    log::info("audit: shard {}: writing to {} again after {} failed attempts", self->_opt.shard, self->_path,
              self->_failures);
    self->_failures = 0;
  }
  self->_backoff_ms = 0;
  b.written += static_cast<size_t>(res);
  self->_stats.bytes_written.add(static_cast<uint64_t>(res));
  if (self->_dirty_fd != b.fd && b.fd != self->_nosync_fd && !self->_closed) {
    SLUICE_ASSERT(self->_dirty_fd < 0);  // pump syncs another file before writing to this one
    self->_dirty_fd = b.fd;
    self->_dirty_since_ms = self->_now_ms;
  }
  if (b.written < b.len) {
    // A short write on a regular file means the disk or a limit is full; the
    // rest goes out at once, before any later batch of this shard (if the
    // disk is still full it fails, and the backoff applies).
    self->_stats.short_writes.add();
    self->submit_write();
    return;
  }
  self->finish_batch();
  self->pump();
}

void writer::write_failed(int res) noexcept {
  _stats.write_errors.add();
  if (_failures++ == 0) {
    log::error("audit: shard {}: write to {} failed: {}; retrying with backoff, lines kept (further errors only counted)",
               _opt.shard, _path, res == 0 ? "wrote nothing" : std::strerror(-res));
  }
  if (_closed) {  // close() has passed its timeout: nothing will retry this
    give_up(pending());
    return;
  }
  _backoff_ms = _backoff_ms == 0 ? _opt.retry_backoff_ms
                                 : (_backoff_ms > _opt.retry_backoff_max_ms / 2 ? _opt.retry_backoff_max_ms : _backoff_ms * 2);
  _retry_at_ms = _now_ms + _backoff_ms;
}

void writer::on_sync(shard::completion* c, const io_uring_cqe* cqe) {
  writer* self = static_cast<op*>(c)->self;
  SLUICE_ASSERT(self->_syncing);
  self->_syncing = false;
  const int fd = self->_sync_fd;
  self->_sync_fd = -1;
  const int res = cqe->res;
  if (res >= 0) {
    self->_stats.fsyncs.add();
  } else if (res == -EINVAL || res == -EROFS) {
    // The file cannot be synced at all (a pipe, a terminal: path =
    // "/dev/stdout"): stop trying on this fd; its bytes are not on a disk of ours.
    self->_nosync_fd = fd;
    log::info("audit: shard {}: {} cannot be fsync'ed ({}); writing without fsync", self->_opt.shard, self->_path,
              std::strerror(-res));
  } else {
    // EIO, ENOSPC, EDQUOT: writeback of bytes already reported written
    // failed. Not retried: the kernel reports a writeback error to each fd
    // once (errseq, Linux 4.13), so a second fsync would succeed without
    // bringing the bytes back.
    self->_stats.fsync_errors.add();
    if (!self->_sync_error_logged) {
      self->_sync_error_logged = true;
      log::error("audit: shard {}: fsync of {} failed: {}; written lines may not be on disk (further errors only counted)",
                 self->_opt.shard, self->_path, std::strerror(-res));
    }
  }
  self->release_fd(fd);
  self->pump();
}

void writer::finish_batch() noexcept {
  batch& b = pending();
  _stats.lines_written.add(b.lines);
  _stats.batches_written.add();
  // Rotated while this batch was being written: its file may be ours to close now.
  retire(b);
}

void writer::give_up(batch& b) noexcept {
  _stats.lines_lost.add(b.lines);
  retire(b);
}

void writer::retire(batch& b) noexcept {
  const int fd = b.fd;
  if (&b == &pending()) _inflight = false;
  b.len = 0;
  b.written = 0;
  b.lines = 0;
  b.fd = -1;
  release_fd(fd);
}

void writer::release_fd(int fd) noexcept {
  if (fd < 0 || fd == _fd || fd == _dirty_fd || fd == _sync_fd) return;
  if (_inflight && pending().fd == fd) return;
  if (fd == _nosync_fd) _nosync_fd = -1;  // the number may come back for another file
  ::close(fd);
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
  release_fd(old);
  _sync_error_logged = false;  // a new file: report its first failure too
  // A write waiting for its backoff tries the new file at once: rotating is
  // what an operator does about a broken file.
  _retry_at_ms = 0;
  pump();
  return true;
}

bool writer::flush_and_wait(uint32_t timeout_ms) noexcept {
  _closing = true;
  _r.run_once(0);
  const uint64_t start_ms = _r.now_ms();
  for (;;) {
    tick(_r.now_ms());  // retries come due by the reactor's clock, as in the loop
    flush();
    if (settled()) break;
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
  // Past the timeout: what is buffered, or waits for a retry, will never be
  // written. An SQE in the kernel points at our buffers and ops: it is waited
  // for, however long the disk takes; a write that fails now is given up
  // (on_write), one that was short goes on while the disk takes bytes.
  give_up(_batches[_filling]);
  while (_writing || _syncing) _r.run_once(100);
  if (_inflight) give_up(pending());
  // Unsynced bytes stay in the page cache; no new fsync is started here.
  const int dirty = _dirty_fd;
  _dirty_fd = -1;
  const int fd = _fd;
  _fd = -1;
  release_fd(dirty);
  if (fd != dirty) release_fd(fd);
  return ok;
}

}  // namespace sluice::audit
