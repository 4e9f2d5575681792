"""The compiled stage's shortcuts against the plain work they replace (``steps/greedy/compiled.py``,
``steps/roles.py``, ``engine/compiled_loops.stage_loop``):

* a K row loaded as zeros plus its thread's slots (``KSource.local``) is the gathered row, and the
  lazy greedy picks the same units and loads the same rows with it (random problems, odd sizes,
  gaps in the candidates as a mask leaves them, linked units read in full, one candidate);
* the bank tables hold +0.0 across threads in the K row of every unit without a support link
  when cross-thread support is off, which the local rows rely on (banks with facts' links);
* ``unit_roles``' softmax with ``exp(0) = 1`` at its largest logit equals the plain one.
"""
from __future__ import annotations

import numpy as np
import pytest

from trawmem_gpu.select._jit import HAS_NUMBA, njit
from trawmem_gpu.select.config import SelectConfig
from trawmem_gpu.select.engine import SelectionEngine
from trawmem_gpu.select.steps.greedy import CompiledQuery, GreedyScratch, KSource, StopRule, lazy_greedy_one
from trawmem_gpu.select.steps.greedy.compiled import FusedWeights
from trawmem_gpu.select.steps.roles import unit_roles
from trawmem_gpu.store.view import unit_view

from layered_banks import layered_bank

pytestmark = pytest.mark.skipif(not HAS_NUMBA, reason="needs numba")


def _problem(rng, n, T, kn):
    """``n`` candidates in ``T`` threads (ascending slots), a bank of ``kn`` units with gaps, a K
    table zero across threads except in the rows of linked units."""
    lt = np.sort(rng.integers(0, T, n))
    cq = np.sort(rng.choice(kn, n, replace=False))
    uthread = np.zeros(kn, np.int64)
    uthread[cq] = lt
    rest = np.setdiff1d(np.arange(kn), cq)
    uthread[rest] = rng.integers(0, T + 2, len(rest))  # units not among the candidates
    K = rng.random((kn, kn)) * (uthread[:, None] == uthread[None, :])
    np.fill_diagonal(K, 1.0)
    linked = rng.random(kn) < 0.15
    K[linked] = np.maximum(K[linked], (rng.random((int(linked.sum()), kn)) < 0.1) * 0.7)  # links reach any thread
    return lt, cq, K, linked


def _query(rng, n, lt, ks, budget):
    pq = rng.random(n)
    pq /= pq.sum()
    T = int(lt.max()) + 1 if n else 1
    mass = np.bincount(lt, pq, minlength=T)
    rho = rng.dirichlet(np.ones(3), n)
    return CompiledQuery(pq, rho, rng.random(3), rng.random(n) * 0.01, lt, mass[lt], mass[lt].copy() * 1.5, ks,
                         FusedWeights(1.0, 0.5, 0.3), StopRule(budget, 2.0, budget))


def _scratch(n, T):
    U = max(n, 1)
    return GreedyScratch(np.zeros(U * U), np.empty(U), np.empty(3), np.empty(U), np.empty(U, np.int64),
                         np.empty(U, np.int64), np.zeros(U, np.bool_), np.zeros(max(T, 1), np.bool_), np.empty(U),
                         np.zeros(max(T, 1), np.bool_))


@pytest.mark.parametrize("n,T,kn", [(1, 1, 3), (2, 2, 5), (17, 4, 40), (140, 26, 589), (61, 1, 61)])
def test_local_k_rows_equal_gathered_rows(n, T, kn):
    rng = np.random.default_rng(n + T + kn)
    lt, cq, K, linked = _problem(rng, n, T, kn)
    t0 = np.array([np.flatnonzero(lt == t).min() if (lt == t).any() else n for t in range(T)], np.int64)
    t1 = np.array([np.flatnonzero(lt == t).max() + 1 if (lt == t).any() else 0 for t in range(T)], np.int64)
    local = ~linked[cq]
    for budget in (1, 5, n):
        q = np.random.default_rng(budget)
        plain = _query(q, n, lt, KSource(K.reshape(-1), 0, kn, cq, False), budget)
        fast = plain._replace(K=KSource(K.reshape(-1), 0, kn, cq, False, local, t0, t1))
        out = []
        for g in (plain, fast):
            s, sel = _scratch(n, T), np.full(n, -1, np.int64)
            k = lazy_greedy_one(g, s, sel)
            rows = s.Kc.reshape(max(n, 1), -1)[:, :n][s.loaded[:n]]
            out.append((k, sel.tolist(), s.loaded[:n].tolist(), rows.view(np.int64).tolist()))
        assert out[0] == out[1]
        assert out[0][0] == min(budget, n) and sum(out[0][2]) >= out[0][0]  # rows were loaded and read


def test_bank_k_rows_are_zero_across_threads_without_a_link():
    raw = [layered_bank("a", (3, 1, 5, 2, 7, 4), 1, n_facts=9), layered_bank("c", (2, 6, 3, 3, 1, 5, 2), 3, n_facts=12)]
    banks = [unit_view(b, ("turns", "facts")) for b in raw]
    eng = SelectionEngine(banks, SelectConfig(), device="cpu")
    assert not eng.cfg.cross_thread and eng.plan.tables
    snap = eng._store.snapshot
    n, off = snap.np, snap.off
    checked = linked_rows = 0
    for b, bank in enumerate(banks):
        N, u0 = int(off.nu[b]), int(off.uo[b])
        K = n["ktab"][int(off.koff[b]):int(off.koff[b]) + N * N].reshape(N, N)
        lt = n["unit_thread"][u0:u0 + N]
        free = n["linked"][u0:u0 + N] == 0
        other = lt[:, None] != lt[None, :]
        assert (K[free][other[free]].view(np.int64) == 0).all()  # +0.0, bit for bit
        checked += int(free.sum())
        linked_rows += int((~free).sum())
    assert checked > 0 and linked_rows > 0  # both kinds of rows exist here


@njit()
def _roles_plain(f, Mq, delta, q, T_R, rho, u):  # pragma: no cover - compiled
    R, F = Mq.shape[1], Mq.shape[2]
    lg = np.empty(R)
    mx = -np.inf
    for r in range(R):
        acc = 0.0
        for k in range(F):
            acc += Mq[q, r, k] * f[k]
        lg[r] = acc / T_R
        mx = max(mx, lg[r])
    den = 0.0
    for r in range(R):
        lg[r] = np.exp(lg[r] - mx)
        den += lg[r]
    phi = 0.0
    for r in range(R):
        rho[u, r] = lg[r] / den
        phi += rho[u, r] * delta[q, r]
    return phi


@pytest.mark.parametrize("R", [1, 2, 3, 5])
def test_unit_roles_equals_the_plain_softmax(R):
    rng = np.random.default_rng(R)
    Q, F = 9, 7
    Mq = rng.normal(size=(Q, R, F))
    Mq[0] = 0.0  # every logit tied at the top
    Mq[1, :, :] = Mq[1, :1, :]  # tied rows
    delta = rng.random((Q, R))
    for q in range(Q):
        f = rng.normal(size=F)
        a, b = np.zeros((2, R)), np.zeros((2, R))
        pa = unit_roles(f, Mq, delta, q, 0.7, np.empty(R), a, 1)
        pb = _roles_plain(f, Mq, delta, q, 0.7, b, 1)
        assert pa == pb and a.view(np.int64).tolist() == b.view(np.int64).tolist()
