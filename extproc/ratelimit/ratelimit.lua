-- One request's rate-limit check, atomically: the same steps as check.evaluate and
-- gcra.take_interval, in the same order and with the same arithmetic (integer microseconds).
--
-- KEYS: n bucket keys, then (when has_repeat) the prompt's arrival list and the block key,
--       then (when keep_ms > 0) the key that keeps this request's verdict.
-- ARGV: now_us ('' = Redis TIME, one clock for every gate replica), n, keep_ms, has_repeat,
--       [limit, window_us, block_us, info when has_repeat], then n x (interval_us, tolerance_us, cost).
-- Idempotent by request: run again with the same verdict key, it returns the kept verdict
-- and charges nothing (a retry after a lost reply cannot spend a bucket twice).
-- Returns {status (0 allowed, 1 limited, 2 blocked), block_left_us, newly_blocked,
--          then per bucket: allowed, remaining, retry_after_us, reset_after_us}.
--
-- Numbers are written with %d: Redis turns a Lua number into text with 14 digits only.
-- Keys outlive their meaning by a second; the values carry their own times.

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local n = tonumber(ARGV[2])
local keep_ms = tonumber(ARGV[3])
local done_key = KEYS[#KEYS]
if keep_ms > 0 then
  local kept = redis.call('GET', done_key)
  if kept then
    local out = {}
    for x in string.gmatch(kept, '[^,]+') do out[#out + 1] = tonumber(x) end
    return out
  end
end
local a = 5

local function fmt(x)
  return string.format('%d', x)
end

local function ttl_ms(us)
  return math.floor(us / 1000) + 1000
end

local function keep(out)
  if keep_ms > 0 then
    local parts = {}
    for i, x in ipairs(out) do parts[i] = fmt(x) end
    redis.call('SET', done_key, table.concat(parts, ','), 'PX', keep_ms)
  end
  return out
end

if ARGV[4] == '1' then
  local hkey, bkey = KEYS[n + 1], KEYS[n + 2]
  local limit, window, block = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local info = ARGV[8]
  a = 9
  local held = redis.call('GET', bkey)
  if held then
    local until_us = tonumber(string.match(held, '^(%d+)'))
    if until_us > now then
      return keep({2, until_us - now, 0})
    end
  end
  local recent = {}
  for _, v in ipairs(redis.call('LRANGE', hkey, 0, -1)) do
    if tonumber(v) > now - window then
      recent[#recent + 1] = v
    end
  end
  redis.call('DEL', hkey)
  if #recent >= limit then
    redis.call('SET', bkey, fmt(now + block) .. '|' .. info, 'PX', ttl_ms(block))
    return keep({2, block, 1})
  end
  recent[#recent + 1] = fmt(now)
  redis.call('RPUSH', hkey, unpack(recent))
  redis.call('PEXPIRE', hkey, ttl_ms(window))
end

local out = {0, 0, 0}
local tats = {}
local denied = false
for i = 1, n do
  local interval, tolerance, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  local tat = tonumber(redis.call('GET', KEYS[i]) or now)
  if tat < now then
    tat = now
  end
  local new_tat = tat + interval * cost
  local allow_at = new_tat - tolerance
  if allow_at > now then
    denied = true
    local remaining = math.max(0, math.floor((tolerance - (tat - now)) / interval))
    out[#out + 1] = 0
    out[#out + 1] = remaining
    out[#out + 1] = allow_at - now
    out[#out + 1] = tat - now
  else
    tats[i] = new_tat
    out[#out + 1] = 1
    out[#out + 1] = math.max(0, math.floor((tolerance - (new_tat - now)) / interval))
    out[#out + 1] = 0
    out[#out + 1] = new_tat - now
  end
end

if denied then
  out[1] = 1
else
  for i = 1, n do
    redis.call('SET', KEYS[i], fmt(tats[i]), 'PX', ttl_ms(tats[i] - now))
  end
end
return keep(out)
