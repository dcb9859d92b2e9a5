-- wrk report: one machine-readable line at the end of a run.
--
-- Used by chat.lua; any other wrk script can end with
--   done = dofile("bench/wrk/report.lua").done
--
-- The line is `WRK_RESULT` followed by key=value pairs (integers, µs):
--   requests duration_us rps bytes bytes_per_req
--   lat_mean_us lat_stdev_us lat_max_us p50_us p90_us p99_us p999_us
--   err_connect err_read err_write err_status err_timeout errors
-- `errors` is the sum; err_status counts replies with a status >= 400.
-- Bench scripts take a value with: sed -n 's/.* p99_us=\([0-9]*\).*/\1/p'.

local M = {}

function M.done(summary, latency, requests)
   local e = summary.errors
   local n = summary.requests
   local secs = summary.duration / 1e6
   local fields = {
      { "requests", n },
      { "duration_us", summary.duration },
      { "rps", secs > 0 and n / secs or 0 },
      { "bytes", summary.bytes },
      { "bytes_per_req", n > 0 and summary.bytes / n or 0 },
      { "lat_mean_us", latency.mean },
      { "lat_stdev_us", latency.stdev },
      { "lat_max_us", latency.max },
      { "p50_us", latency:percentile(50) },
      { "p90_us", latency:percentile(90) },
      { "p99_us", latency:percentile(99) },
      { "p999_us", latency:percentile(99.9) },
      { "err_connect", e.connect },
      { "err_read", e.read },
      { "err_write", e.write },
      { "err_status", e.status },
      { "err_timeout", e.timeout },
      { "errors", e.connect + e.read + e.write + e.status + e.timeout },
   }
   local out = { "WRK_RESULT" }
   for _, f in ipairs(fields) do
      out[#out + 1] = string.format("%s=%d", f[1], math.floor(f[2] + 0.5))
   end
   io.write(table.concat(out, " "), "\n")
end

return M
