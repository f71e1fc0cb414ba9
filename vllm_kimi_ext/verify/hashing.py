"""Counter-based randomness for verification, in plain torch integer ops.

Every random number used by the verifiers is a pure function of
``(seed, position, token id, domain)``. Nothing depends on the batch layout, the
number of shards or the order in which ranks run, which is what makes the
vocabulary-sharded verifier reproduce the full-vocabulary reference token for
token: the Gumbel noise of token ``v`` is the same number whether ``v`` is looked
at by the reference (over the whole vocabulary) or by the rank that owns it.

Hash
----
32-bit lanes are held in ``int64`` tensors and masked to ``[0, 2**32)`` after
every step, so all intermediate values stay non-negative and below ``2**63``:
no signed overflow ever happens, right shifts are logical, and the result is
bit-identical to the same function written with ``uint32`` wrap-around
arithmetic (the Triton kernel in :mod:`.kernels` does exactly that).
Multiplication by a 32-bit constant uses its signed representative in
``[-2**31, 2**31)`` (:func:`mul32`), so products stay within ``(-2**63, 2**63)``.

* ``lowbias32`` (C. Wellons' integer hash, bias ~0.17) is the mixing bijection.
* Per row, ``(domain, seed_lo, seed_hi, pos_lo, pos_hi)`` are absorbed into two
  32-bit row keys ``h1, h2`` (:func:`row_keys`): that part is a few ops per row.
* Per element, the token id ``t`` is mixed with a Weyl step and two further
  ``lowbias32`` rounds: ``lowbias32(lowbias32(h1 + t * 0x9E3779B9) ^ h2)``
  (:func:`element_hash`).

Uniform and Gumbel
------------------
A 32-bit hash ``r`` becomes ``u = hi16 * 2**-16 + (lo16 + 0.5) * 2**-32`` in
float32. Both products are exact, so the single rounding of the sum gives the
correctly rounded value of ``(r + 0.5) * 2**-32`` on any backend (with or
without FMA contraction). Near ``u -> 0`` the full 32 bits of resolution are
kept. ``u`` is clamped to ``<= 1 - 2**-24`` (the largest float32 below 1).

Gumbel noise is ``g = -log(-log1p(-u))``: small ``u`` gives the large-``g`` tail
that decides an argmax, and ``log1p`` keeps that tail precise (a plain
``-log(-log(1 - u))`` would collapse every ``u < 2**-24`` onto one value).
"""

from __future__ import annotations

import torch

M32 = 0xFFFFFFFF
GOLDEN32 = 0x9E3779B9

#: Domain separators: the accept uniform and the sampling noise of the same
#: (seed, position) must be independent.
DOMAIN_ACCEPT = 0x41434350  # "ACCP"
DOMAIN_GUMBEL = 0x47554D42  # "GUMB"

_LB_C1 = 0x7FEB352D
_LB_C2 = 0x846CA68B
_H2_SALT = 0x85EBCA6B

#: Largest float32 strictly below 1.
U_MAX = 1.0 - 2.0**-24


def mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for ``x`` in ``[0, 2**32)`` held in int64, without overflow.

    A constant ``c >= 2**31`` is replaced by ``c - 2**32`` (same residue mod
    ``2**32``), so ``|x * c| < 2**63`` always; masking the (possibly negative)
    two's complement product with ``2**32 - 1`` yields the residue.
    """
    c &= M32
    if c >= 1 << 31:
        c -= 1 << 32
    return (x * c) & M32


def _mul32_(x: torch.Tensor, c: int) -> torch.Tensor:
    c &= M32
    if c >= 1 << 31:
        c -= 1 << 32
    return x.mul_(c).bitwise_and_(M32)


def _lowbias32_(x: torch.Tensor) -> torch.Tensor:
    """In-place :func:`lowbias32` on a tensor the caller owns."""
    x.bitwise_xor_(x >> 16)
    _mul32_(x, _LB_C1)
    x.bitwise_xor_(x >> 15)
    _mul32_(x, _LB_C2)
    x.bitwise_xor_(x >> 16)
    return x


def lowbias32(x: torch.Tensor) -> torch.Tensor:
    """Wellons' ``lowbias32`` bijection on 32-bit lanes held in int64."""
    return _lowbias32_(x.to(torch.int64, copy=True))


def _absorb(h: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    return lowbias32(((h ^ key) + GOLDEN32) & M32)


def row_keys(
    seeds: torch.Tensor, positions: torch.Tensor, domain: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row hash keys ``(h1, h2)`` (int64 tensors with values in ``[0, 2**32)``).

    ``seeds`` and ``positions`` are int64 tensors of the same shape (one entry per
    logits row); negative seeds are fine (two's complement halves are used).
    """
    seeds = seeds.to(torch.int64)
    positions = positions.to(torch.int64)
    h = torch.full_like(seeds, domain & M32)
    h = _absorb(h, seeds & M32)
    h = _absorb(h, (seeds >> 32) & M32)
    h = _absorb(h, positions & M32)
    h = _absorb(h, (positions >> 32) & M32)
    h2 = lowbias32(h ^ _H2_SALT)
    return h, h2


def element_hash(h1: torch.Tensor, h2: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """32-bit hash of ``(row keys, token id)``.

    Broadcasts ``h1/h2 [R, 1]`` with ``token_ids [1, N]``."""
    x = (h1 + mul32(token_ids.to(torch.int64) & M32, GOLDEN32)).bitwise_and_(M32)
    _lowbias32_(x)
    x.bitwise_xor_(h2)
    return _lowbias32_(x)


def uniform_from_bits(r: torch.Tensor) -> torch.Tensor:
    """float32 uniform in ``(0, 1)`` from 32-bit hashes (see module docstring)."""
    hi16 = (r >> 16).to(torch.float32)
    lo16 = (r & 0xFFFF).to(torch.float32)
    u = hi16.mul_(1.52587890625e-05).add_(lo16.add_(0.5).mul_(2.3283064365386963e-10))
    return u.clamp_(max=U_MAX)


def gumbel_from_bits(r: torch.Tensor) -> torch.Tensor:
    """float32 standard Gumbel noise ``-log(-log1p(-u))`` from 32-bit hashes."""
    u = uniform_from_bits(r)
    return u.neg_().log1p_().neg_().log_().neg_()


def accept_uniform(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The acceptance uniform of each row, keyed by (seed, position)."""
    h1, h2 = row_keys(seeds, positions, DOMAIN_ACCEPT)
    return uniform_from_bits(element_hash(h1, h2, torch.zeros_like(h1)))


def gumbel_noise(
    h1: torch.Tensor, h2: torch.Tensor, token_ids: torch.Tensor
) -> torch.Tensor:
    """Gumbel noise ``[R, N]`` for rows with keys ``h1/h2 [R]`` and global ``token_ids [N]``."""
    return gumbel_from_bits(element_hash(h1[:, None], h2[:, None], token_ids[None, :]))
