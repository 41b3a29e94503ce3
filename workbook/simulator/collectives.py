"""What each warp collective computes once every lane it waits for has arrived (scheduler.py
decides when that is): {lane: result} for votes, shuffles, matches and syncwarp, with numba's
result types and PTX's rules for shuffle lanes."""

import struct

import numpy as np

from ..tensor_layouts import MMA_SHAPES, fragment_coordinates, truncate_tf32

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


# The types the kernel's compiler gives: numba-cuda's by default; numba-cuda-mlir's (a uint32 lane
# mask, int32 from popc/ffs/clz) when WORKBOOK_COMPILER names it (simulator.install).
SUCCESSOR_TYPES = False


def lane_mask(bits):
    """A lane mask as the kernel's compiler returns it: numba-cuda's int32, the successor's uint32."""
    return np.uint32(bits) if SUCCESSOR_TYPES else as_int32(bits)


def _resolve_vote(call, block):
    predicates = {lane: predicate for lane, (_, _, (predicate,)) in call.calls.items()}
    ballot = sum(1 << lane for lane, predicate in predicates.items() if predicate)
    everyone, anyone = all(predicates.values()), any(predicates.values())
    results = {}
    for lane, (_, op, _) in call.calls.items():
        if op == "ballot_sync":
            results[lane] = lane_mask(ballot)
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
            results[lane] = lane_mask(same)
        else:
            results[lane] = (lane_mask(call.arrived), True) if uniform else (lane_mask(0), False)
    return results


def _resolve_syncwarp(call, block):
    return dict.fromkeys(call.calls)


def _whole_warp(call):
    """mma and ldmatrix are .sync.aligned: every lane of a full warp executes the same one. A _Raise
    for all of them if not (a GPU's result is undefined), else None."""
    warp = next(thread for thread, _, _ in call.calls.values()).warp
    ops = {op for _, op, _ in call.calls.values()}
    if call.arrived == FULL and len(ops) == 1:
        return None
    if len(ops) > 1:
        why = f"its lanes called different instructions ({', '.join(sorted(ops))}) together"
    elif warp.existing != FULL:
        why = (f"the warp has only {warp.existing.bit_length()} lanes (the block's size is not a multiple of "
               "32)")
    else:
        missing = [lane for lane in range(WARP_SIZE) if not call.arrived >> lane & 1]
        why = f"lane(s) {', '.join(map(str, missing[:8]))}{' ...' if len(missing) > 8 else ''} skipped it (exited)"
    error = RuntimeError(f"{'/'.join(sorted(ops))} in warp {warp.index}: {why}. It is a warp-wide instruction "
                         "(.sync.aligned): all 32 lanes must execute it, outside any branch that some lanes skip; "
                         "on a GPU the result is undefined")
    return dict.fromkeys(call.calls, _Raise(error))


FULL = (1 << WARP_SIZE) - 1
_LANES = np.arange(WARP_SIZE)


def _fragment_index(kind):
    """Per register, the flat indices of A (M x K), B (K x N) and C (M x N) each lane holds; for 16-bit
    kinds the first of the pair (the second is the next column of A, the next row of B)."""

    m, n, k = MMA_SHAPES[kind]
    where = fragment_coordinates(kind)
    return (where["a"][..., 0] * k + where["a"][..., 1], where["b"][..., 0] * n + where["b"][..., 1],
            where["c"][..., 0] * n + where["c"][..., 1])


_FRAGMENTS = {}


def _resolve_mma(call, block):
    wrong = _whole_warp(call)
    if wrong is not None:
        return wrong
    kind = call.calls[0][2][0]
    if kind not in _FRAGMENTS:
        _FRAGMENTS[kind] = _fragment_index(kind)
    a_at, b_at, c_at = _FRAGMENTS[kind]

    m, n, k = MMA_SHAPES[kind]
    regs_a = np.array([call.calls[lane][2][1] for lane in range(WARP_SIZE)], np.uint32)
    regs_b = np.array([call.calls[lane][2][2] for lane in range(WARP_SIZE)], np.uint32)
    c = np.zeros(m * n, np.float32)
    c[c_at] = np.array([call.calls[lane][2][3] for lane in range(WARP_SIZE)], np.float32)
    a, b = np.zeros(m * k, np.float32), np.zeros(k * n, np.float32)
    if kind == "tf32":  # the tensor core reads the top 19 bits: sign, exponent, 10 of mantissa
        a[a_at], b[b_at] = truncate_tf32(regs_a.view(np.float32)), truncate_tf32(regs_b.view(np.float32))
    else:  # two 16-bit values a register: the low half first (the next column of A, the next row of B)
        def halves(regs):
            low, high = regs & np.uint32(0xFFFF), regs >> np.uint32(16)
            if kind == "f16":
                return low.astype(np.uint16).view(np.float16), high.astype(np.uint16).view(np.float16)
            return (low << np.uint32(16)).view(np.float32), (high << np.uint32(16)).view(np.float32)
        low, high = halves(regs_a)
        a[a_at], a[a_at + 1] = low, high
        low, high = halves(regs_b)
        b[b_at], b[b_at + n] = low, high
    d = (a.reshape(m, k).astype(np.float64) @ b.reshape(k, n) + c.reshape(m, n)).astype(np.float32).reshape(-1)
    out = d[c_at]
    return {lane: tuple(out[lane]) for lane in range(WARP_SIZE)}


def _resolve_fragment_rows(call, block):
    """wgmma with A from registers: each lane gave mma_f16's A fragment of the warp's 16 x 16 block of
    A; lane L gets rows L // 4 and L // 4 + 8 of it (float64, 2 x 16): the rows its accumulators use."""
    wrong = _whole_warp(call)
    if wrong is not None:
        return wrong
    if "f16" not in _FRAGMENTS:
        _FRAGMENTS["f16"] = _fragment_index("f16")
    a_at = _FRAGMENTS["f16"][0]
    regs = np.array([call.calls[lane][2] for lane in range(WARP_SIZE)], np.uint32)
    a = np.zeros(16 * 16, np.float16)
    a[a_at] = (regs & np.uint32(0xFFFF)).astype(np.uint16).view(np.float16)
    a[a_at + 1] = (regs >> np.uint32(16)).astype(np.uint16).view(np.float16)
    a = a.reshape(16, 16).astype(np.float64)
    return {lane: a[[lane // 4, lane // 4 + 8]] for lane in range(WARP_SIZE)}


def _resolve_ldmatrix(call, block):
    """Lane 8i + r gave row r of matrix i; lane L gets, of each matrix, row L // 4's elements 2(L % 4)
    and 2(L % 4) + 1 in one register (the low half first), or with .trans column L // 4's."""
    wrong = _whole_warp(call)
    if wrong is not None:
        return wrong
    count, trans, _ = call.calls[0][2]
    registers = []
    for matrix in range(count):
        rows = []
        for r in range(8):
            flat, index = call.calls[8 * matrix + r][2][2]
            start = index * flat.itemsize
            rows.append(flat.view(np.uint8)[start:start + 16].view(np.uint16))
        m = np.stack(rows).astype(np.uint32)  # 8 x 8 16-bit values
        if trans:
            m = m.T
        pairs = m.reshape(8, 4, 2)  # row, column pair, half
        registers.append(pairs[_LANES // 4, _LANES % 4, 0] | pairs[_LANES // 4, _LANES % 4, 1] << np.uint32(16))
    return {lane: tuple(np.uint32(reg[lane]) for reg in registers) for lane in range(WARP_SIZE)}


RESOLVERS = {"vote": _resolve_vote, "shfl": _resolve_shuffle, "match": _resolve_match, "syncwarp": _resolve_syncwarp,
             "mma": _resolve_mma, "ldmatrix": _resolve_ldmatrix, "fragment_rows": _resolve_fragment_rows}
