"""The counter-based hash: bit-exact against a pure-Python model, frozen values, noise quality."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import torch

import vllm_kimi_ext
from vllm_kimi_ext.verify import hashing as H

REPO = Path(vllm_kimi_ext.__file__).resolve().parents[1]

M = 0xFFFFFFFF


def _lb(x):
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M
    x ^= x >> 15
    x = (x * 0x846CA68B) & M
    x ^= x >> 16
    return x


def _absorb(h, k):
    return _lb(((h ^ k) + 0x9E3779B9) & M)


def _row_keys_py(seed, pos, domain):
    h = domain & M
    for k in (seed & M, (seed >> 32) & M, pos & M, (pos >> 32) & M):
        h = _absorb(h, k)
    return h, _lb(h ^ 0x85EBCA6B)


def _elem_py(h1, h2, t):
    return _lb(_lb((h1 + t * 0x9E3779B9) & M) ^ h2)


def test_bit_exact_against_python_model():
    seeds = [0, 1, -1, 2**62 + 12345, -(2**63), 2**63 - 1, 987654321]
    pos = [0, 5, 2**31, 2**40 + 3, 17, 1, 2**33]
    tokens = [0, 1, 2, 163839, 163840, 2**24 - 1, 70000]
    h1, h2 = H.row_keys(torch.tensor(seeds), torch.tensor(pos), H.DOMAIN_GUMBEL)
    got = H.element_hash(h1[:, None], h2[:, None], torch.tensor(tokens)[None, :])
    for i, (s, p) in enumerate(zip(seeds, pos)):
        a, b = _row_keys_py(s, p, H.DOMAIN_GUMBEL)
        assert (int(h1[i]), int(h2[i])) == (a, b)
        assert got[i].tolist() == [_elem_py(a, b, t) for t in tokens]


def test_frozen_values():
    """Changing the hash changes every sampled token: it must be deliberate."""
    h1, h2 = H.row_keys(torch.tensor([7]), torch.tensor([3]), H.DOMAIN_GUMBEL)
    bits = H.element_hash(h1[:, None], h2[:, None], torch.arange(4)[None, :])[0].tolist()
    assert bits == [_elem_py(*_row_keys_py(7, 3, H.DOMAIN_GUMBEL), t) for t in range(4)]
    assert bits == FROZEN_BITS
    u = H.accept_uniform(torch.tensor([7]), torch.tensor([3]))
    assert abs(float(u) - FROZEN_U) < 1e-7
    g = H.gumbel_noise(h1, h2, torch.arange(4))[0].tolist()
    assert all(abs(a - b) < 1e-5 for a, b in zip(g, [-1.20023, -0.579997, 0.841570, 0.374861]))


FROZEN_BITS = [4139828746, 3575028362, 1503936915, 2135073763]
FROZEN_U = 0.9161748886108398


def test_uniform_range_and_tail_resolution():
    r = torch.tensor([0, 1, 2**16, 2**31, M - 1, M])
    u = H.uniform_from_bits(r)
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert abs(float(u[0]) - 0.5 * 2**-32) < 1e-16  # full 32-bit resolution near 0
    assert float(u[1]) > float(u[0])
    g = H.gumbel_from_bits(r)
    assert bool(torch.isfinite(g).all())
    assert float(g[0]) > 22.0  # the winning tail is not truncated at ~16.6


def test_gumbel_moments():
    h1, h2 = H.row_keys(torch.tensor([11, 12]), torch.tensor([0, 0]), H.DOMAIN_GUMBEL)
    g = H.gumbel_noise(h1, h2, torch.arange(500_000)).double()
    assert abs(float(g.mean()) - 0.5772156649) < 0.01
    assert abs(float(g.var()) - math.pi**2 / 6) < 0.02
    # the two rows are uncorrelated
    c = torch.corrcoef(g)[0, 1]
    assert abs(float(c)) < 0.01


def test_accept_uniform_independent_of_gumbel_domain():
    s = torch.arange(1000)
    p = torch.zeros(1000, dtype=torch.int64)
    u = H.accept_uniform(s, p)
    h1, h2 = H.row_keys(s, p, H.DOMAIN_GUMBEL)
    v = H.uniform_from_bits(H.element_hash(h1, h2, torch.zeros_like(h1)))
    assert not torch.equal(u, v)
    assert abs(float(torch.corrcoef(torch.stack([u, v]))[0, 1])) < 0.1


def test_imports_without_triton_and_vllm():
    code = (
        "import sys\n"
        "sys.modules['triton'] = None\n"
        "sys.modules['vllm'] = None\n"
        "import torch\n"
        "import vllm_kimi_ext.verify as v\n"
        "from vllm_kimi_ext.verify import backend\n"
        "from testkit import verify_simulate as simulate\n"
        "assert not backend.triton_available()\n"
        "b = v.VerifyBatch.from_draft_tokens([[1, 2]], [1.0], [3])\n"
        "z = torch.randn(3, 10)\n"
        "out, _, _ = simulate.simulate_sharded_verify(z, b, 2, 10)\n"
        "assert out.tokens() == v.ReferenceVerifier(10).verify(z, b).tokens()\n"
        "assert 'vllm' not in [m.split('.')[0] for m, x in sys.modules.items() if x]\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=REPO, env=env, check=False)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr

