-- Token budget of one tenant: GCRA with a cost in tokens, the same arithmetic as budget.py.
-- KEYS[1] the bucket (its TAT, integer microseconds).
-- ARGV: now (us), interval (us per token), tolerance (us: tokens per minute x interval),
--       cost (tokens; negative gives tokens back).
-- Returns {allowed, remaining, retry_after_us, reset_after_us}.
local now = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local tolerance = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end

local function store(new_tat)
  local ttl = math.max(1, math.ceil((new_tat - now) / 1000))
  redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', ttl)
end

if cost < 0 then
  local new_tat = math.max(now, tat + cost * interval)
  store(new_tat)
  return {1, math.max(0, math.floor((tolerance - (new_tat - now)) / interval)), 0, new_tat - now}
end
local new_tat = tat + interval * cost
local allow_at = new_tat - tolerance
if allow_at > now then
  return {0, math.max(0, math.floor((tolerance - (tat - now)) / interval)), allow_at - now, tat - now}
end
store(new_tat)
return {1, math.max(0, math.floor((tolerance - (new_tat - now)) / interval)), 0, new_tat - now}
