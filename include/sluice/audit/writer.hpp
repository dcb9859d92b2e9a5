#pragma once
// audit: the per-shard batching writer for the audit log.
//
// File layout: ONE file (`[audit] path`) shared by all shards, opened with
// O_APPEND. Each shard writes whole batches of whole lines with
// IORING_OP_WRITE at offset -1. On a local filesystem (ext4, xfs, btrfs,
// tmpfs) a write(2) to a regular file holds the inode lock for the whole
// call and, with O_APPEND, places its bytes at end-of-file under that lock, so
// batches from several shards land one after another and never interleave
// within a line. The writes are issued with IOSQE_ASYNC so the kernel
// performs each as one blocking ->write_iter call from an io-wq worker (see
// submit_write for why the non-blocking first attempt is avoided). Why not per-shard files: operators, logrotate and the
// tests then see one log with one line per request, and rotation stays a
// plain rename + SIGUSR1. The limits, documented: NFS does not give O_APPEND
// this guarantee; and a short write (only on ENOSPC / EFBIG / RLIMIT_FSIZE)
// is completed with a second write that another shard's batch may precede —
// a disk-full condition, counted and logged.
//
// Memory: two fixed buffers per shard (double buffering), allocated once.
// One buffer fills while the other is in the kernel; at most one write is in
// flight per shard, so a shard's lines stay in order and a short write's
// remainder goes out before the next batch. When the filling buffer is full
// and the other is still being written (a burst faster than the disk: ten
// thousand streams ending at once), the filling buffer grows, doubling, up
// to max_buffer_bytes: audit lines are billing records and are not dropped
// for a burst. Only past that bound is a record dropped and counted: the
// data plane never blocks on the disk, and allocates only in such a burst.
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "sluice/audit/record.hpp"
#include "sluice/metrics/counter.hpp"
#include "sluice/shard/reactor.hpp"

namespace sluice::audit {

// Read cross-thread as relaxed atomics (single writer: the owning shard).
struct writer_stats {
  metrics::counter lines_appended;   // accepted into a batch
  metrics::counter lines_written;    // confirmed by a write completion
  metrics::counter lines_dropped;    // both buffers busy at max_buffer_bytes, or no file open
  metrics::counter buffer_grows;     // a burst grew the filling buffer
  metrics::counter lines_lost;       // in a batch whose write failed
  metrics::counter bytes_written;
  metrics::counter batches_written;
  metrics::counter short_writes;
  metrics::counter write_errors;
  metrics::counter reopens;
  metrics::counter reopen_errors;
};

// Shard-local. One per shard, from shard start until close() at shutdown;
// created, used and closed on the shard's own thread with its reactor.
class writer {
 public:
  struct options {
    size_t buffer_bytes = 256 * 1024;   // per buffer; two per shard
    size_t max_buffer_bytes = 64u << 20; // a filling buffer grows up to this while the other is in flight
    uint32_t flush_interval_ms = 100;   // a non-empty batch waits at most this long
    unsigned shard = 0;                 // for log lines only
  };

  // Opens `path` (O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, mode 0640).
  // Returns: the writer, or nullptr after a log line naming the path and the
  // error (a start-up failure: the caller exits).
  static std::unique_ptr<writer> open(shard::reactor& r, std::string path, const options& o);
  ~writer();
  writer(const writer&) = delete;
  writer& operator=(const writer&) = delete;

  // Hot path: formats the record into the filling batch. A full batch is
  // handed to the kernel at once when no write is in flight.
  // Returns: false when the record was dropped (counted in stats).
  bool append(const record& rec) noexcept;

  // Call once per loop iteration (the reactor's on_iteration hook): hands the
  // batch to the kernel when it has waited flush_interval_ms.
  void tick(uint64_t now_ms) noexcept;

  // Hands the filling batch to the kernel now if no write is in flight.
  void flush() noexcept;

  // SIGUSR1 (log rotation): opens `path` anew; lines from now on go to the
  // new file. The old fd stays open until the write in flight on it
  // completes, so nothing appended before the reopen is lost (it lands in
  // the renamed file or the new one). The open(2) itself is synchronous: a
  // cold path, once per rotation. Returns: false if the open failed (the
  // old file stays in use; logged).
  bool reopen() noexcept;

  // Shutdown (SIGTERM): flushes everything appended so far, running the
  // reactor's run_once() until no write is in flight and the batches are
  // empty, or until timeout_ms passes. Other completions that arrive
  // meanwhile are dispatched as usual. Returns: true when all was written.
  bool flush_and_wait(uint32_t timeout_ms) noexcept;

  // flush_and_wait(), then closes the file. append() drops after this.
  // Returns: as flush_and_wait.
  bool close(uint32_t timeout_ms = 5000) noexcept;

  bool idle() const noexcept;            // nothing buffered, nothing in flight
  const writer_stats& stats() const noexcept { return _stats; }
  const std::string& path() const noexcept { return _path; }

 private:
  // A buffer is either filling (owned by the shard) or in flight (owned by
  // the kernel from submit until its CQE): `_inflight` says which.
  struct batch {
    std::unique_ptr<char[]> data;
    size_t cap = 0;        // bytes of data
    size_t len = 0;        // bytes formatted
    size_t written = 0;    // bytes confirmed by completions (in flight only)
    uint64_t lines = 0;
    int fd = -1;           // the file this batch is being written to
  };
  struct write_op : shard::completion {
    writer* self = nullptr;
  };

  writer(shard::reactor& r, std::string path, const options& o);
  static void on_write(shard::completion* c, const io_uring_cqe* cqe);
  void submit_write() noexcept;
  void start_batch() noexcept;
  // Doubles the filling batch (bounded). Returns: whether a line fits now.
  bool grow(batch& b) noexcept;
  void finish_batch(uint64_t lines_ok, uint64_t lines_bad) noexcept;
  void release_fd(int fd) noexcept;

  shard::reactor& _r;
  std::string _path;
  options _opt;
  batch _batches[2];
  unsigned _filling = 0;        // index of the batch being filled
  bool _inflight = false;       // batch 1 - _filling is in the kernel
  int _fd = -1;                 // where new batches go
  uint64_t _now_ms = 0;         // last tick
  uint64_t _batch_started_ms = 0;  // tick time of the first line in the filling batch
  bool _error_logged = false;
  bool _drop_logged = false;
  bool _closing = false;        // flush_and_wait: write the next batch as soon as one completes
  bool _closed = false;
  write_op _op{};
  writer_stats _stats;
};

}  // namespace sluice::audit
