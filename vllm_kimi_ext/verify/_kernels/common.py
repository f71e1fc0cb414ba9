"""The Triton helpers every round's kernels share: the counter-based hash of
:mod:`..hashing` written with ``uint32`` wrap-around arithmetic (bit-identical to the
masked int64 torch version; row keys derived in-kernel from ``(seed, position)``), the
sortable keys of (value, id) pairs and the launch lock.

Keys: ``ordered(value) * 2**32 + (2**31 - 1 - id)`` where ``ordered`` is the
order-preserving int32 image of the float32 value, so a descending sort gives
(value desc, id asc); ids are below ``2**24``. bf16 logits use 32-bit keys
(:func:`_key16`) of the value's 16 bits and the local column.
"""

from __future__ import annotations

import threading

import triton
import triton.language as tl

from ..hashing import _H2_SALT, DOMAIN_ACCEPT, DOMAIN_GUMBEL, GOLDEN32, U_MAX

_GOLDEN = tl.constexpr(GOLDEN32)

_UMAX = tl.constexpr(U_MAX)

_C1 = tl.constexpr(0x7FEB352D)

_C2 = tl.constexpr(0x846CA68B)

_SALT = tl.constexpr(_H2_SALT)

_DOM_ACCEPT = tl.constexpr(DOMAIN_ACCEPT)

_DOM_GUMBEL = tl.constexpr(DOMAIN_GUMBEL)

_SENT = tl.constexpr(-(2**63) + 1)



@triton.jit
def _lowbias32(x):
    x = x ^ (x >> 16)
    x = x * tl.full((), _C1, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full((), _C2, tl.uint32)
    x = x ^ (x >> 16)
    return x



@triton.jit
def _absorb(h, k):
    return _lowbias32((h ^ k) + tl.full((), _GOLDEN, tl.uint32))



@triton.jit
def _row_keys(seed, pos, domain: tl.constexpr):
    """(h1, h2) of :func:`.hashing.row_keys` for int64 scalars ``seed``, ``pos``."""
    seed = seed.to(tl.int64)
    pos = pos.to(tl.int64)
    h = tl.full((), domain, tl.uint32)
    h = _absorb(h, (seed & 0xFFFFFFFF).to(tl.uint32))
    h = _absorb(h, ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    h = _absorb(h, (pos & 0xFFFFFFFF).to(tl.uint32))
    h = _absorb(h, ((pos >> 32) & 0xFFFFFFFF).to(tl.uint32))
    h2 = _lowbias32(h ^ tl.full((), _SALT, tl.uint32))
    return h, h2



@triton.jit
def _element_hash(h1, h2, gid):
    x = h1 + gid.to(tl.uint32) * tl.full((), _GOLDEN, tl.uint32)
    x = _lowbias32(x)
    return _lowbias32(x ^ h2)



@triton.jit
def _uniform(x):
    hi16 = (x >> 16).to(tl.int32).to(tl.float32)
    lo16 = (x & 0xFFFF).to(tl.int32).to(tl.float32)
    u = hi16 * 1.52587890625e-05 + (lo16 + 0.5) * 2.3283064365386963e-10
    return tl.minimum(u, _UMAX)



@triton.jit
def _log1p(x):
    # Goldberg's accurate log1p from log (portable: no libdevice needed).
    w = 1.0 + x
    return tl.where(w == 1.0, x, tl.log(w) * (x / (w - 1.0)))



@triton.jit
def _gumbel(h1, h2, gid):
    u = _uniform(_element_hash(h1, h2, gid))
    return -tl.log(-_log1p(-u))



@triton.jit
def _okey(z):
    """Ordered key in ``[0, 65536)`` of bf16 ``z``: the order of ``z`` (and of ``z / T`` for
    T > 0: distinct bf16 values stay distinct); ``-0.0`` keys as ``+0.0``."""
    b = z.to(tl.int16, bitcast=True).to(tl.int32)
    b = tl.where(b == -32768, 0, b)
    return (b ^ ((b >> 15) & 0x7FFF)) + 32768



@triton.jit
def _key_value(key, t):
    """``s = z / T`` of the bf16 value whose :func:`_okey` is ``key``."""
    o = key - 32768
    b = o ^ ((o >> 15) & 0x7FFF)
    z = b.to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32)
    return tl.div_rn(z, t)



@triton.jit
def hash_bits_kernel(out_ptr, seed_ptr, pos_ptr, n, BLOCK: tl.constexpr):
    """Debug kernel: raw 32-bit Gumbel-domain hash of tokens ``0..n-1`` per row."""
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    h1, h2 = _row_keys(tl.load(seed_ptr + r), tl.load(pos_ptr + r), _DOM_GUMBEL)
    x = _element_hash(h1, h2, cols)
    tl.store(out_ptr + r * n + cols, x.to(tl.int64), mask=cols < n)



@triton.jit
def _draft_col(draft_ptr, row, col_offset, n_valid):
    d = tl.load(draft_ptr + row).to(tl.int64)
    local = d - col_offset
    owned = (d >= 0) & (local >= 0) & (local < n_valid)
    return tl.where(owned, local, -1).to(tl.int32)



@triton.jit
def _kept(s, thr, col, lim):
    """The cut of :mod:`.cuts`: above the threshold, or tied with it up to column ``lim``."""
    return (s > thr) | ((s == thr) & (col <= lim))



@triton.jit
def _key(s, gid):
    bits = s.to(tl.int32, bitcast=True)
    bits = tl.where(bits == -2147483648, 0, bits)  # -0.0 sorts as +0.0 (equal values)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return ordered.to(tl.int64) * 4294967296 + (2147483647 - gid.to(tl.int64))



@triton.jit
def _unkey(k):
    ordered = (k >> 32).to(tl.int32)
    bits = ordered ^ ((ordered >> 31) & 0x7FFFFFFF)
    val = bits.to(tl.float32, bitcast=True)
    gid = 2147483647 - (k & 0xFFFFFFFF)
    val = tl.where(k == _SENT, float("-inf"), val)
    gid = tl.where(k == _SENT, -1, gid)
    return val, gid



@triton.jit
def _key16(z, col):
    """int32 key of bf16 logits ``z`` at local column ``col`` (< 65536), sorting as
    (value, then column descending)."""
    return (_okey(z) - 32768) * 65536 + (65535 - col)



@triton.jit
def _unkey16(k, t):
    """``(z / T, local column)`` of int32 keys (``-inf, -1`` for the sentinel)."""
    sent = k == -2147483648
    v = _key_value((k >> 16) + 32768, t)
    return tl.where(sent, float("-inf"), v), tl.where(sent, -1, 65535 - (k & 0xFFFF))



#: Triton's CPU interpreter (TRITON_INTERPRET=1) patches ``triton.language`` globally for the
#: duration of a launch, so two threads launching at once (the threaded TP simulation in
#: ``testkit.verify_simulate``) break each other. Launches are serialised; the
#: uncontended lock costs nanoseconds on a GPU, where each rank is its own process anyway.
_LAUNCH_LOCK = threading.Lock()
