"""Philox4x32-10, the counter-based generator of Salmon et al. (SC'11, Random123), twice:

    philox4x32(c0, c1, c2, c3, k0, k1)        a numba device function: 4 uint32 in, 4 uint32 out
    philox4x32_reference(counters, key)       the same in vectorised NumPy, for the checks

Counter-based means stateless: the output is a pure function of a 128-bit counter and a 64-bit key,
so thread t can compute "random number number q" without anyone having computed numbers 0..q-1 and
without a state in memory. The two copies must agree bit for bit; both are tested against the
published Random123 known-answer vectors (KNOWN_ANSWERS below).

One round (ten of them, the key bumped by the Weyl constants between rounds):

    (hi0, lo0) = M0 * c0          64-bit product of two 32-bit words
    (hi1, lo1) = M1 * c2
    c = (hi1 ^ c1 ^ k0,  lo1,  hi0 ^ c3 ^ k1,  lo0)

Integer types matter twice over. On the GPU numba widens uint32 arithmetic to 64 bits, so every
32-bit result is cut back with np.uint32(... & MASK32); in the simulator the same lines run on NumPy
scalars, where a uint32 product would overflow, so every product is formed in uint64 first. Written
this way, the one source means the same thing in both places.
"""

import numpy as np
from numba import cuda

from workbook.host import by_rows

PHILOX_M0 = np.uint64(0xD2511F53)  # round multipliers
PHILOX_M1 = np.uint64(0xCD9E8D57)
PHILOX_W0 = np.uint64(0x9E3779B9)  # Weyl key increments: golden ratio, sqrt(3) - 1
PHILOX_W1 = np.uint64(0xBB67AE85)
MASK32 = np.uint64(0xFFFFFFFF)
SHIFT32 = np.uint64(32)
ROUNDS = 10

# Random123's kat_vectors: counter (4 words), key (2 words) -> output (4 words).
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@cuda.jit(device=True, forceinline=True)
def philox_round(c0, c1, c2, c3, k0, k1):
    product0 = PHILOX_M0 * np.uint64(c0)  # a 32 x 32 -> 64-bit multiply (mul.wide.u32)
    product1 = PHILOX_M1 * np.uint64(c2)
    hi0 = np.uint32(product0 >> SHIFT32)
    lo0 = np.uint32(product0 & MASK32)
    hi1 = np.uint32(product1 >> SHIFT32)
    lo1 = np.uint32(product1 & MASK32)
    return (np.uint32((hi1 ^ c1 ^ k0) & MASK32), lo1,
            np.uint32((hi0 ^ c3 ^ k1) & MASK32), lo0)


@cuda.jit(device=True, forceinline=True)
def bump_key(k0, k1):
    # Wrap-around add mod 2^32, done in 64 bits so that NumPy scalars cannot overflow.
    return (np.uint32((np.uint64(k0) + PHILOX_W0) & MASK32),
            np.uint32((np.uint64(k1) + PHILOX_W1) & MASK32))


@cuda.jit(device=True, forceinline=True)
def philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of the counter (c0, c1, c2, c3) under the key (k0, k1): four uint32 words.

    All six arguments are uint32. Ten rounds, written out, so that everything stays in registers
    (a loop would be unrolled by LLVM too; written out, it is plain to see that nothing is indexed).
    """
    c0, c1, c2, c3 = philox_round(c0, c1, c2, c3, k0, k1)
    k0, k1 = bump_key(k0, k1)
    c0, c1, c2, c3 = philox_round(c0, c1, c2, c3, k0, k1)
    k0, k1 = bump_key(k0, k1)
    c0, c1, c2, c3 = philox_round(c0, c1, c2, c3, k0, k1)
    k0, k1 = bump_key(k0, k1)
    c0, c1, c2, c3 = philox_round(c0, c1, c2, c3, k0, k1)
    k0, k1 = bump_key(k0, k1)
    c0, c1, c2, c3 = philox_round(c0, c1, c2, c3, k0, k1)
    k0, k1 = bump_key(k0, k1)
    c0, c1, c2, c3 = philox_round(c0, c1, c2, c3, k0, k1)
    k0, k1 = bump_key(k0, k1)
    c0, c1, c2, c3 = philox_round(c0, c1, c2, c3, k0, k1)
    k0, k1 = bump_key(k0, k1)
    c0, c1, c2, c3 = philox_round(c0, c1, c2, c3, k0, k1)
    k0, k1 = bump_key(k0, k1)
    c0, c1, c2, c3 = philox_round(c0, c1, c2, c3, k0, k1)
    k0, k1 = bump_key(k0, k1)
    return philox_round(c0, c1, c2, c3, k0, k1)


@cuda.jit
def philox_kernel(counters, key, out):
    """Test harness: out[t, :] = philox4x32(counters[t, :], key), one counter per thread."""
    t = cuda.grid(1)
    if t < counters.shape[0]:
        r0, r1, r2, r3 = philox4x32(counters[t, 0], counters[t, 1], counters[t, 2], counters[t, 3],
                                    key[0], key[1])
        out[t, 0] = r0
        out[t, 1] = r1
        out[t, 2] = r2
        out[t, 3] = r3


@by_rows  # each counter on its own: on every core for a GPU's 2^26 counters (workbook/host.py)
def philox4x32_reference(counters, key):
    """NumPy Philox4x32-10: counters uint32[m, 4], key (k0, k1) -> uint32[m, 4]. Vectorised over m."""
    counters = np.asarray(counters, dtype=np.uint32).reshape(-1, 4)
    c0, c1, c2, c3 = (counters[:, j].astype(np.uint64) for j in range(4))
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for round_index in range(ROUNDS):
        if round_index:
            k0, k1 = (k0 + PHILOX_W0) & MASK32, (k1 + PHILOX_W1) & MASK32
        product0, product1 = PHILOX_M0 * c0, PHILOX_M1 * c2
        c0, c1, c2, c3 = ((product1 >> SHIFT32) ^ c1 ^ k0, product1 & MASK32,
                          (product0 >> SHIFT32) ^ c3 ^ k1, product0 & MASK32)
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)
