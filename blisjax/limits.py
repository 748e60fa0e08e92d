"""Numeric limits every part of blisjax shares (a leaf module: it imports nothing)."""

#: The largest int64: simulated times are int64 µs, and "no horizon" is this.
INT64_MAX = (1 << 63) - 1
