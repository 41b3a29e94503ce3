"""What each warp collective computes once every lane it waits for has arrived (scheduler.py
decides when that is): {lane: result} for votes, shuffles, matches and syncwarp, with numba's
result types and PTX's rules for shuffle lanes."""

import struct

import numpy as np

WARP_SIZE = 32

# The four modes of PTX shfl.sync; numba always shuffles across the whole warp (no `width`).
SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_BFLY = "idx", "up", "down", "bfly"


class StrictModeError(RuntimeError):
    """Raised under WORKBOOK_SIM_STRICT=1 where a kernel relies on behaviour a GPU leaves undefined."""


class _Raise:
    """A result the woken lane must raise: a strict-mode error found by whichever lane completed the call."""

    def __init__(self, error):
        self.error = error


def as_int32(bits):
    """A 32-bit lane mask as numba returns it from ballot_sync / match_*_sync: a signed int32."""
    return np.int32(bits - (1 << 32) if bits & 0x80000000 else bits)


def _resolve_vote(call, block):
    predicates = {lane: predicate for lane, (_, _, (predicate,)) in call.calls.items()}
    ballot = sum(1 << lane for lane, predicate in predicates.items() if predicate)
    everyone, anyone = all(predicates.values()), any(predicates.values())
    results = {}
    for lane, (_, op, _) in call.calls.items():
        if op == "ballot_sync":
            results[lane] = as_int32(ballot)
        elif op == "all_sync":
            results[lane] = everyone
        elif op == "any_sync":
            results[lane] = anyone
        else:  # eq_sync: the predicates are uniform
            results[lane] = everyone or not anyone
    return results


def shfl_source_lane(mode, lane, operand):
    """The lane a shuffle reads, as PTX shfl.sync computes it with numba's clamp values.

    Only operand bits 4..0 count, so a source lane of 33 means lane 1 and -1 means lane 31;
    up/down past the edge of the warp read the caller's own lane."""
    b = int(operand) & (WARP_SIZE - 1)
    if mode == SHFL_IDX:
        return b
    if mode == SHFL_UP:
        return lane - b if lane - b >= 0 else lane
    if mode == SHFL_DOWN:
        return lane + b if lane + b < WARP_SIZE else lane
    return lane ^ b


def _resolve_shuffle(call, block):
    warp = next(thread for thread, _, _ in call.calls.values()).warp
    results = {}
    for lane, (thread, op, (mode, value, operand)) in call.calls.items():
        source = shfl_source_lane(mode, lane, operand)
        if source in call.calls:
            results[lane] = call.calls[source][2][1]
        elif block.strict:
            if not warp.existing >> source & 1:
                why = f"does not exist (warp {warp.index} has {warp.existing.bit_length()} lanes)"
            elif not warp.live >> source & 1:
                why = "has exited"
            else:
                why = f"is not in the mask {call.mask:#010x}"
            results[lane] = _Raise(
                StrictModeError(
                    f"lane {lane} of warp {warp.index} reads lane {source} in {op}(mask={call.mask:#010x}), "
                    f"but lane {source} {why}: the value is undefined on a GPU"
                )
            )
        else:
            results[lane] = value  # undefined on a GPU; the caller's own value here
    return results


def bit_pattern(value):
    """What match_*_sync compares: the bits, so 0.0 != -0.0 and a NaN matches the same NaN."""
    if isinstance(value, np.floating):
        return int(value.view(np.int64 if value.dtype.itemsize == 8 else np.int32))
    if isinstance(value, float):
        return struct.unpack("<q", struct.pack("<d", value))[0]
    return int(value)


def _resolve_match(call, block):
    patterns = {lane: bit_pattern(value) for lane, (_, _, (value,)) in call.calls.items()}
    uniform = len(set(patterns.values())) == 1
    results = {}
    for lane, (_, op, _) in call.calls.items():
        if op == "match_any_sync":
            same = sum(1 << other for other, pattern in patterns.items() if pattern == patterns[lane])
            results[lane] = as_int32(same)
        else:
            results[lane] = (as_int32(call.arrived), True) if uniform else (np.int32(0), False)
    return results


def _resolve_syncwarp(call, block):
    return dict.fromkeys(call.calls)


RESOLVERS = {"vote": _resolve_vote, "shfl": _resolve_shuffle, "match": _resolve_match, "syncwarp": _resolve_syncwarp}
