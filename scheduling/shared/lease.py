"""The shared dispatcher owner's timings (scheduling.shared.owner), the Redis scripts it runs on
its lease (each checks the owner's token first: the fence), and `LostLease`."""

from __future__ import annotations

LEASE_MS = 1000  # a standby takes over this long after the owner stopped renewing, at most
STANDBY_POLL_MS = 100
RETRY_S = 1.0  # after a failure (Redis out of reach), before bidding again
IDLE_PUMP_MS = 500  # while requests wait, a step at least this often (the embedded dispatcher's config-poll pump)
MAX_ENTRIES = 32  # stream entries per step (each `protocol.BATCH_MAX` commands at most)
SNAPSHOT_EVERY_S = 5.0
GATEWAY_TTL_MS = 10_000  # a gateway silent this long is gone (its event loop beats every second)
GATEWAY_CHECK_S = 0.5
OUT_TTL_MS = 60_000  # an answer list nobody reads (its gateway died) goes after this
QUIET_COMMIT_MS = 50  # a step that answered nobody is logged with the next one, or after this long
SNAPSHOT_MS_PER_REQUEST = 0.1  # what recording the engine is assumed to cost per live request, until measured
SNAPSHOT_REQUESTS_FLOOR = 1000  # the cost measured with fewer live requests is spread over this many
SNAPSHOT_STRETCH_MAX_MS = 30_000  # the longest a snapshot may stretch the lease (see `Owner.commit`)

# Renewals (the commit's, `RENEW_SCRIPT`) never shorten the lease: a snapshot may have stretched it (`STRETCH_SCRIPT`).
COMMIT_SCRIPT = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return false end
if redis.call('pttl', KEYS[1]) < tonumber(ARGV[2]) then redis.call('pexpire', KEYS[1], ARGV[2]) end
local a = 5
local tail = redis.call('xrevrange', KEYS[2], '+', '-', 'COUNT', 1)
local id = '0-0'
if tail[1] then id = tail[1][1] end
for _ = 1, tonumber(ARGV[4]) do
  local fields = {'now', ARGV[a], 'last', ARGV[a + 1], 'prev', id}
  if ARGV[a + 2] ~= '' then table.insert(fields, 'cfg'); table.insert(fields, ARGV[a + 2]) end
  if ARGV[a + 3] ~= '' then table.insert(fields, 'o'); table.insert(fields, ARGV[a + 3]) end
  id = redis.call('xadd', KEYS[2], '*', unpack(fields))
  a = a + 4
end
for i = 3, #KEYS do
  redis.call('rpush', KEYS[i], ARGV[a])
  redis.call('pexpire', KEYS[i], ARGV[3])
  a = a + 1
end
return id
"""

RENEW_SCRIPT = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('pttl', KEYS[1]) < tonumber(ARGV[2]) then redis.call('pexpire', KEYS[1], ARGV[2]) end
return 1
"""

STRETCH_SCRIPT = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('pexpire', KEYS[1], ARGV[2])
"""

SNAPSHOT_SCRIPT = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('pexpire', KEYS[1], ARGV[6])
redis.call('hset', KEYS[2], 'state', ARGV[2], 'step', ARGV[3], 'cmd', ARGV[4], 'now', ARGV[5])
redis.call('xtrim', KEYS[3], 'MINID', ARGV[3])
redis.call('xtrim', KEYS[4], 'MINID', ARGV[4])
return 1
"""

RELEASE_SCRIPT = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class LostLease(Exception):
    """Another owner holds the lease: this one stands down."""
