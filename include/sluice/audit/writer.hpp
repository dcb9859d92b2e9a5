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
// One buffer fills while the other is being written; at most one write is in
// flight per shard, so a shard's lines stay in order and a short write's
// remainder goes out before the next batch. When the filling buffer is full
// and the other is still being written (a burst faster than the disk: ten
// thousand streams ending at once; or a disk that fails and is retried), the
// filling buffer grows, doubling, up to max_buffer_bytes: audit lines are
// billing records and are not dropped for a burst. Only past that bound is a
// record dropped and counted: the data plane never blocks on the disk, and
// allocates only in such a burst.
//
// Durability: a failed write (EIO, ENOSPC, EDQUOT…) keeps its batch and is
// retried after a backoff (retry_backoff_ms, doubling up to
// retry_backoff_max_ms), from the first byte not yet written; a batch is
// given up (lines_lost) only by close() once its timeout has passed. Bytes
// on the file are fdatasync'ed (IORING_OP_FSYNC with IORING_FSYNC_DATASYNC)
// at most fsync_interval_ms after they were written, so a host crash loses at
// most that much of what the writer reported written.
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
  metrics::counter lines_lost;       // given up by close() after its timeout (never written)
  metrics::counter bytes_written;
  metrics::counter batches_written;
  metrics::counter short_writes;
  metrics::counter write_errors;     // failed write attempts (each one retried)
  metrics::counter fsyncs;           // completed fdatasyncs
  metrics::counter fsync_errors;     // fdatasyncs that failed (the kernel reported lost writeback)
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
    // Written bytes are fdatasync'ed at most this long after they were
    // written, and fsyncs come at most this often; 0 = after every batch.
    uint32_t fsync_interval_ms = 1000;
    uint32_t retry_backoff_ms = 100;     // after a failed write; doubles per failure in a row
    uint32_t retry_backoff_max_ms = 5000;
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

  // Call once per loop iteration (the reactor's on_iteration hook), with the
  // reactor's clock: hands the batch to the kernel when it has waited
  // flush_interval_ms, retries a failed write whose backoff has passed, and
  // starts an fsync that is due. Completions take their time from the last
  // tick.
  void tick(uint64_t now_ms) noexcept;

  // Hands the filling batch to the kernel now if no write is in flight.
  void flush() noexcept;

  // SIGUSR1 (log rotation): opens `path` anew; lines from now on go to the
  // new file. The old fd stays open until the write in flight on it
  // completes and what was written to it is fsync'ed, so nothing appended
  // before the reopen is lost (it lands in the renamed file or the new one).
  // A batch waiting for a retry, none of it written yet, goes to the new file
  // at once. The open(2) itself is synchronous: a cold path, once per
  // rotation. Returns: false if the open failed (the old file stays in use;
  // logged).
  bool reopen() noexcept;

  // Shutdown (SIGTERM): flushes everything appended so far, running the
  // reactor's run_once() (and tick() with the reactor's clock, for retries)
  // until the batches are written and fsync'ed, or until timeout_ms passes.
  // Other completions that arrive meanwhile are dispatched as usual.
  // Returns: true when all was written.
  bool flush_and_wait(uint32_t timeout_ms) noexcept;

  // flush_and_wait(), then closes the file. append() drops after this. What
  // is still buffered or waiting for a retry then is given up, counted in
  // lines_lost; a write or fsync still in the kernel is waited for (a write
  // that fails then is given up too).
  // Returns: as flush_and_wait.
  bool close(uint32_t timeout_ms = 5000) noexcept;

  bool idle() const noexcept;            // nothing buffered, nothing being written (fsync aside)
  const writer_stats& stats() const noexcept { return _stats; }
  const std::string& path() const noexcept { return _path; }

 private:
  // A buffer is either filling (owned by the shard) or being written (from
  // start_batch until its last byte is confirmed: in the kernel, or waiting
  // for a retry): `_inflight` says which.
  struct batch {
    std::unique_ptr<char[]> data;
    size_t cap = 0;        // bytes of data
    size_t len = 0;        // bytes formatted
    size_t written = 0;    // bytes confirmed by completions (being written only)
    uint64_t lines = 0;
    int fd = -1;           // the file this batch is being written to
  };
  struct op : shard::completion {
    writer* self = nullptr;
  };

  writer(shard::reactor& r, std::string path, const options& o);
  static void on_write(shard::completion* c, const io_uring_cqe* cqe);
  static void on_sync(shard::completion* c, const io_uring_cqe* cqe);
  batch& pending() noexcept { return _batches[_filling ^ 1u]; }
  // Submits what is due, one SQE at a time: an fsync, the pending batch's
  // write, or the filling batch handed over.
  void pump() noexcept;
  void submit_write() noexcept;
  void submit_sync() noexcept;
  void start_batch() noexcept;
  // Doubles the filling batch (bounded). Returns: whether a line fits now.
  bool grow(batch& b) noexcept;
  void write_failed(int res) noexcept;
  void finish_batch() noexcept;
  void give_up(batch& b) noexcept;  // counts its lines lost
  void retire(batch& b) noexcept;   // empties it and lets go of its file
  // Closes `fd` unless the current file, a write, an fsync or unsynced bytes
  // still refer to it; the last of those to let go calls this again.
  void release_fd(int fd) noexcept;
  bool settled() const noexcept { return idle() && !_syncing && _dirty_fd < 0; }

  shard::reactor& _r;
  std::string _path;
  options _opt;
  batch _batches[2];
  unsigned _filling = 0;        // index of the batch being filled
  bool _inflight = false;       // batch 1 - _filling is being written
  // At most one SQE in the kernel, a write or an fsync: an fsync then covers
  // every write that completed before it, and the order stays simple.
  bool _writing = false;
  bool _syncing = false;
  int _fd = -1;                 // where new batches go
  int _dirty_fd = -1;           // written to since its last fsync started
  int _sync_fd = -1;            // the fsync in the kernel runs on this file
  int _nosync_fd = -1;          // a file that cannot be synced (EINVAL: a pipe, /dev/stdout)
  uint64_t _dirty_since_ms = 0; // tick time of the first write _dirty_fd has not synced
  uint64_t _now_ms = 0;         // last tick
  uint64_t _batch_started_ms = 0;  // tick time of the first line in the filling batch
  uint64_t _retry_at_ms = 0;    // a failed write goes again no earlier than this
  uint32_t _backoff_ms = 0;     // the wait after the next failure; 0: none failed yet
  uint64_t _failures = 0;       // failed write attempts in a row (logged once per run)
  bool _sync_error_logged = false;
  bool _drop_logged = false;
  bool _closing = false;        // flush_and_wait: write the next batch as soon as one completes
  bool _closed = false;
  op _write_op{};
  op _sync_op{};
  writer_stats _stats;
};

}  // namespace sluice::audit
