// The lease protocol's Lua scripts (see scripts.hpp for the hash's layout
// and the reply). Each script is the shared prologue plus its own body, so
// that refill and lease expiry read the same everywhere.
#include "sluice/cluster/scripts.hpp"

#include <string>

#include "sluice/core/assert.hpp"

namespace sluice::cluster {

namespace {

// ARGV[1] = limit (tokens per minute), ARGV[2] = the amount (want / returned
// / charged), ARGV[3] = instance id. Leaves: key, limit, amount, inst, now,
// level, leases (inst -> {amount, expiry}, live ones only), outstanding.
constexpr std::string_view k_prologue = R"lua(local key = KEYS[1]
local limit = tonumber(ARGV[1])
local amount = tonumber(ARGV[2])
local inst = ARGV[3]
if not limit or limit <= 0 then return redis.error_reply('ERR sluice: limit must be > 0') end
if not amount or amount < 0 then return redis.error_reply('ERR sluice: amount must be >= 0') end
if not inst or inst == '' then return redis.error_reply('ERR sluice: no instance id') end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate = limit / 60000
local level, ts = limit, now
local leases = {}
local h = redis.call('HGETALL', key)
for i = 1, #h, 2 do
  local f, v = h[i], tonumber(h[i + 1])
  if f == 'level' then level = v or limit
  elseif f == 'ts' then ts = v or now
  else
    local id = string.sub(f, 3)
    local l = leases[id] or {0, 0}
    if string.sub(f, 1, 2) == 'l:' then l[1] = v or 0 else l[2] = v or 0 end
    leases[id] = l
  end
end
-- Server time only; a clock that stepped back refills nothing.
if now > ts then level = level + (now - ts) * rate end
-- Also trims a level above a lowered limit.
if level > limit then level = limit end
local outstanding = 0
for id, l in pairs(leases) do
  if l[2] <= now then
    redis.call('HDEL', key, 'l:' .. id, 'e:' .. id)
    leases[id] = nil
  else
    outstanding = outstanding + l[1]
  end
end
local function finish(tokens)
  redis.call('HSET', key, 'level', tostring(level), 'ts', tostring(now))
  redis.call('PEXPIRE', key, math.ceil((limit - level) / rate) + 60000)
  return {math.floor(tokens), math.floor(level), now, math.floor(outstanding)}
end
)lua";

// ARGV[4] = ttl_ms. Takes min(want, level) whole tokens (none while the level
// is at or below zero); the instance's lease record becomes this grant,
// expiring ttl_ms from now (a grant of 0 leaves the record as it was).
constexpr std::string_view k_lease = R"lua(local ttl = tonumber(ARGV[4])
if not ttl or ttl < 1 or ttl > 60000 then return redis.error_reply('ERR sluice: ttl_ms must be 1-60000') end
local granted = 0
if level > 0 then granted = math.floor(math.min(amount, level)) end
if granted > 0 then
  level = level - granted
  local before = leases[inst]
  if before then outstanding = outstanding - before[1] end
  outstanding = outstanding + granted
  redis.call('HSET', key, 'l:' .. inst, granted, 'e:' .. inst, now + ttl)
end
return finish(granted)
)lua";

// Unused tokens back into the bucket (capped at limit), and the instance's
// lease record shrinks by as much (gone at zero).
constexpr std::string_view k_give_back = R"lua(local before = level
level = math.min(limit, level + amount)
local l = leases[inst]
if l then
  local left = l[1] - amount
  if left > 0 then
    redis.call('HSET', key, 'l:' .. inst, left)
    outstanding = outstanding - amount
  else
    redis.call('HDEL', key, 'l:' .. inst, 'e:' .. inst)
    outstanding = outstanding - l[1]
  end
end
return finish(level - before)
)lua";

// Tokens an instance admitted while it could not reach Redis, taken from
// the bucket after the fact: the level may go below zero (later leases wait
// for the refill), but never below -limit (one minute of refill).
constexpr std::string_view k_charge = R"lua(local before = level
level = math.max(-limit, level - amount)
return finish(before - level)
)lua";

// The budget counters (scripts.hpp). Own totals only grow within a window,
// so "raise to" is idempotent; the expiry is set only when a field moved
// (every instance computes the same one from the window's end).
constexpr std::string_view k_budget = R"lua(local inst = ARGV[1]
if not inst or inst == '' then return redis.error_reply('ERR sluice: no instance id') end
if #ARGV ~= 1 + 3 * #KEYS then return redis.error_reply('ERR sluice: budget wants 3 arguments per key') end
local ft, fs = 't:' .. inst, 's:' .. inst
local out = {}
for i, key in ipairs(KEYS) do
  local at = 1 + (i - 1) * 3
  local tokens, spend, expire_at = ARGV[at + 1], ARGV[at + 2], tonumber(ARGV[at + 3])
  local t, s = tonumber(tokens), tonumber(spend)
  if not t or not s or t < 0 or s < 0 or not expire_at then
    return redis.error_reply('ERR sluice: budget amounts must be >= 0 and the expiry a number')
  end
  local moved = false
  if t > 0 and (tonumber(redis.call('HGET', key, ft)) or 0) < t then
    redis.call('HSET', key, ft, tokens)
    moved = true
  end
  if s > 0 and (tonumber(redis.call('HGET', key, fs)) or 0) < s then
    redis.call('HSET', key, fs, spend)
    moved = true
  end
  if moved then redis.call('PEXPIREAT', key, expire_at) end
  out[i] = redis.call('HGETALL', key)
end
return out
)lua";

}  // namespace

std::string_view script_source(script s) noexcept {
  // Built once, on the first call (the client's start, a cold path).
  static const std::string sources[k_script_count] = {
      std::string(k_prologue).append(k_lease),
      std::string(k_prologue).append(k_give_back),
      std::string(k_prologue).append(k_charge),
      std::string(k_budget),
  };
  const auto i = static_cast<unsigned>(s);
  SLUICE_VERIFY(i < k_script_count);
  return sources[i];
}

std::string_view script_name(script s) noexcept {
  switch (s) {
    case script::lease: return "lease";
    case script::give_back: return "give_back";
    case script::charge: return "charge";
    case script::budget: return "budget";
  }
  return "?";
}

}  // namespace sluice::cluster
