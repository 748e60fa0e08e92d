"""Numeric limits and units every part of blisjax shares (a leaf module: it imports nothing)."""

#: The largest int64: simulated times are int64 µs, and "no horizon" is this.
INT64_MAX = (1 << 63) - 1

#: µs per hour.
US_PER_HOUR = 3.6e9
#: KV utilization is recorded in whole percent: buckets 0 .. 100.
KV_UTIL_BUCKETS = 100
