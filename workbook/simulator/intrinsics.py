"""The warp intrinsics of numba.cuda, as methods of the simulator's FakeCUDAModule (`cuda` inside a
simulated kernel): votes, shuffles, match, syncwarp, activemask, lanemask_lt, and the bit functions
with numba's types. Each collective hands itself to the calling thread's BlockScheduler."""

import sys

import numpy as np

from .numba_typing import DeclaredInt, as_read

from . import collectives
from .collectives import SHFL_BFLY, SHFL_DOWN, SHFL_IDX, SHFL_UP
from .scheduler import FULL_MASK, _is_integer, current

# --------------------------------------------------------------------------------------------------
# The intrinsics, as methods of FakeCUDAModule (`cuda` inside a simulated kernel). The argument order
# and return types are numba-cuda's (numba/cuda/intrinsics.py, cudadecl.py, cudaimpl.py), and so are
# the operand types: what numba would refuse to compile for a GPU is a TypeError here too.


def _vote_predicate(op, predicate):
    if not (_is_integer(predicate) or isinstance(predicate, (bool, np.bool_))):
        raise TypeError(f"{op} takes a bool or integer predicate, not a {type(predicate).__name__} (as numba on a GPU)")
    return bool(predicate)


def _shuffle_value(op, value):
    value = as_read(value)
    if isinstance(value, DeclaredInt) and value.dtype in (np.int32, np.int64):  # an argument declared int32 or int64
        value = value.dtype.type(value)
    # A Python int or float is an int64 or float64 to numba.
    if not (isinstance(value, (np.int32, np.int64, np.float32, np.float64)) or type(value) in (int, float)):
        raise TypeError(
            f"{op} shuffles int32, int64, float32 and float64 values only; numba does not compile it for a "
            f"{type(value).__name__} on a GPU (convert first, e.g. numba.int64(value))"
        )
    return value


def _collective(kind, op, mask, *operands):
    me = current()
    return me.block.warp_collective(me, kind, op, mask, operands)


def ballot_sync(self, mask, predicate):
    return _collective("vote", "ballot_sync", mask, _vote_predicate("ballot_sync", predicate))


def all_sync(self, mask, predicate):
    return _collective("vote", "all_sync", mask, _vote_predicate("all_sync", predicate))


def any_sync(self, mask, predicate):
    return _collective("vote", "any_sync", mask, _vote_predicate("any_sync", predicate))


def eq_sync(self, mask, predicate):
    return _collective("vote", "eq_sync", mask, _vote_predicate("eq_sync", predicate))


def shfl_sync(self, mask, value, src_lane):
    return _collective("shfl", "shfl_sync", mask, SHFL_IDX, _shuffle_value("shfl_sync", value), src_lane)


def shfl_up_sync(self, mask, value, delta):
    return _collective("shfl", "shfl_up_sync", mask, SHFL_UP, _shuffle_value("shfl_up_sync", value), delta)


def shfl_down_sync(self, mask, value, delta):
    return _collective("shfl", "shfl_down_sync", mask, SHFL_DOWN, _shuffle_value("shfl_down_sync", value), delta)


def shfl_xor_sync(self, mask, value, lane_mask):
    return _collective("shfl", "shfl_xor_sync", mask, SHFL_BFLY, _shuffle_value("shfl_xor_sync", value), lane_mask)


def match_any_sync(self, mask, value):
    return _collective("match", "match_any_sync", mask, value)


def match_all_sync(self, mask, value):
    return _collective("match", "match_all_sync", mask, value)


def syncwarp(self, mask=FULL_MASK):
    _collective("syncwarp", "syncwarp", mask)


def activemask(self):
    me = current()
    # The call site: each frame from the caller up to the kernel, so that one device function called
    # from two branches counts as two sites, as two program counters would on a GPU.
    site, frame = [], sys._getframe(1)
    while frame is not None:
        site.append((frame.f_code, frame.f_lasti))
        if frame.f_code is me.block.kernel_code:
            break
        frame = frame.f_back
    return me.block.activemask(me, tuple(site))


def lanemask_lt(self):
    return np.uint32(current().bit - 1)


# Bit manipulation. numba types a numpy integer as itself and a plain Python int as int64 (uint64 from
# 2**63 up); popc and clz return that type, ffs a uint32, and brev exists only for uint32 and uint64:
# numba converts every other integer (int64 included) to uint32, keeping the low 32 bits.


def _bits_and_width(value):
    if isinstance(value, (bool, np.bool_)):
        return int(value), 8  # numba picks the int8 overload for a boolean
    width = value.dtype.itemsize * 8 if isinstance(value, np.integer | DeclaredInt) else 64
    return int(value) & ((1 << width) - 1), width


def _like(value, result):
    if isinstance(value, DeclaredInt):
        return value.dtype.type(result)
    return type(value)(result) if isinstance(value, np.integer) else result


def _counted(value, result):
    """popc/clz/ffs's result: the argument's type under numba-cuda (ffs: uint32), int32 under the successor."""
    return np.int32(result) if collectives.SUCCESSOR_TYPES else value


def popc(self, value):
    value = as_read(value)
    bits, _ = _bits_and_width(value)
    count = bin(bits).count("1")
    return _counted(_like(value, count), count)


def clz(self, value):
    value = as_read(value)
    bits, width = _bits_and_width(value)
    return _counted(_like(value, width - bits.bit_length()), width - bits.bit_length())


def ffs(self, value):
    value = as_read(value)
    bits, _ = _bits_and_width(value)
    lowest = (bits & -bits).bit_length()  # lowest set bit, counted from 1; 0 for 0
    return _counted(np.uint32(lowest), lowest)


def brev(self, value):
    value = as_read(value)
    if isinstance(value, np.uint64) or (type(value) is int and value >= 1 << 63):  # numba's uint64 overload
        return np.uint64(int(f"{int(value):064b}"[::-1], 2))
    low_bits = int(value) & FULL_MASK  # anything else is converted to uint32
    return np.uint32(int(f"{low_bits:032b}"[::-1], 2))


INTRINSICS = {
    "ballot_sync": ballot_sync,
    "all_sync": all_sync,
    "any_sync": any_sync,
    "eq_sync": eq_sync,
    "shfl_sync": shfl_sync,
    "shfl_up_sync": shfl_up_sync,
    "shfl_down_sync": shfl_down_sync,
    "shfl_xor_sync": shfl_xor_sync,
    "match_any_sync": match_any_sync,
    "match_all_sync": match_all_sync,
    "syncwarp": syncwarp,
    "activemask": activemask,
    "lanemask_lt": lanemask_lt,
    "popc": popc,
    "clz": clz,
    "ffs": ffs,
    "brev": brev,
}
