"""Training the role head from gold evidence labels: a differentiable surrogate of the selection.

Per training question, everything that does not depend on the head is computed once with the
reference pipeline's own pieces (``localize`` and ``objective.support_kernel``):
the candidate set U_q, the unit features f_q(v), the affinities, r~, the graph part of the cost
``G(T_j, v) = Dhead(j, thread(v)) + d_in(v)``, the kernel K and the modular terms' unit inputs.
The head-dependent rest -- delta, rho = softmax(M(delta) f / T_R), phi, C = G + lambda_m (1 -
alpha) + lambda_r (1 - phi), w = min(kappa, sum_j r~_j exp(-C_j / tau)), pi -- is re-implemented in
torch (``surrogate``), float64, padded over a chunk of questions; the greedy's marginal gains are
J's own (``objective.modular_gain``, the coverage terms' torch gains and updates, ``objective.combine_gain``).

Loss (default ``loss_kind="listwise"``, per question with gold units in U_q): the greedy is
unrolled on-policy for ``steps`` steps (default B). At step t the free units' marginal gains
g_t(v) -- the terms of J against the current state; at t = 0 that is ``w_cov sum_u pi(u)
K(v, u) + w_role delta . rho(v) + m(v) + w_thr mass(thread(v))`` -- are standardised
over the free units (so the loss does not depend on the overall scale of the weights, as the
argmax does not) and scored listwise, ``-log sum_{v in gold, free} softmax(g_t / temp)``; the
unit the greedy actually picks (argmax of g_t, lowest index on ties, as the reference) enters
the state without gradient, and the next step scores the still-unpicked gold. ``steps=1`` is the
plain first-step surrogate. Alternatives kept for comparison: ``pick`` (only at wrong picks, the
best free gold against the pick) and ``topb`` (smooth recall@B of the persistent first-step
score). Plus ``l2 * ||theta - theta_0||^2`` (theta_0 = the hand-set start). Adam, seeded,
deterministic for a fixed torch thread count.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..select.config import SelectConfig
from ..select.context import BankContext
from ..select.params import QueryParams
from ..select.objective import ModularInputs, combine_gain, date_seconds, modular_gain, support_kernel
from ..select.reference import localize
from ..select.terms import COVERAGE_TERMS, QUERY_WEIGHTS, CoverageData, Pick
from ..select.steps.priority import effective_budget
from ..dictconfig import with_keywords
from .defaults import FitOptions
from .model import LEARNED_WEIGHTS, RoleHead, save_head

_BIG = 1e6  # finite stand-in for unreachable head-to-head costs (exp(-1e6 / tau) == 0)
_IDX = {k: i for i, k in enumerate(LEARNED_WEIGHTS)}
LOSS_KINDS = ("listwise", "pick", "topb")


@dataclass
class QItem:
    """One question's head-independent selection inputs (local indices into U_q)."""

    bank_id: str
    qid: str
    category: int
    x: np.ndarray        # [4] demand features
    cand: np.ndarray     # [U] bank unit ids of U_q
    f: np.ndarray        # [U, F] unit features (UNIT_FEATURES order)
    alpha: np.ndarray    # [U]
    r: np.ndarray        # [T] r~ of the neighbourhood threads
    lt: np.ndarray       # [U] local thread of each candidate
    G: np.ndarray        # [T, U] graph part of the cost
    K: np.ndarray        # [U, U]
    gold: np.ndarray     # [U] bool, candidate is gold evidence
    n_gold: int          # gold ids of the question (in or out of U_q)
    attrs: np.ndarray    # [U, A] the candidates' inputs of J's modular terms
    now: float = math.nan  # the question's date (POSIX seconds), NaN if none


def precompute(ctx: BankContext, question: str, z: np.ndarray, cfg: SelectConfig, gold_ids=(), qid: str = "",
               category: int = 0, now=None, params: QueryParams | None = None) -> QItem:
    """The head-independent part of ``select_reference`` for one question (same functions, same
    order; ``params``: the query's B, H, T, None = the defaults)."""
    cfg = cfg.resolved()
    bank = ctx.bank
    loc = localize(ctx, question, z, cfg, (params or QueryParams()).resolved(cfg), now)
    cand, lt = loc.cand, loc.lt
    G = np.minimum(loc.graph_cost, _BIG)
    K = support_kernel(loc.S, lt[:, None] == lt[None, :], cfg, ctx.support_floor(cand, cfg))
    ids = {t.turn_id: i for i, t in enumerate(bank.turns)}
    gold_units = {ids[g] for g in gold_ids if g in ids}
    gold = np.array([int(c) in gold_units for c in cand], dtype=bool)
    return QItem(bank.bank_id, qid, category, loc.x, cand, loc.f, loc.alpha, loc.rvec, lt, G, K, gold,
                 len(set(gold_ids)), loc.attrs, date_seconds(now))


def prepare_items(convs, banks, Z: np.ndarray, cfg: SelectConfig, categories=(1, 2, 3, 4),
                  progress: bool = False, params: QueryParams | None = None) -> list[QItem]:
    """QItems for every question of ``categories`` with evidence, in ``run_eval``'s order (Z rows),
    each prepared with the query parameters ``params``."""
    ctxs = {b.bank_id: BankContext.of(b) for b in banks}
    items = [(c.bank_id, q) for c in convs for q in c.questions if q.category in categories and q.evidence]
    if len(items) != len(Z):
        raise ValueError(f"{len(Z)} query vectors for {len(items)} questions")
    return [precompute(ctxs[b], q.question, z, cfg, q.evidence, q.qid, q.category, params=params)
            for (b, q), z in tqdm(list(zip(items, Z)), desc="precompute", disable=not progress)]


# ------------------------------------------------------------------------------------- batches
def _pad_batch(items: list[QItem], budget: int) -> dict[str, torch.Tensor]:
    Q = len(items)
    U = max(len(it.cand) for it in items)
    T = max(len(it.r) for it in items)
    F = items[0].f.shape[1]
    dt = torch.float64
    b = {"X": torch.zeros(Q, 4, dtype=dt), "f": torch.zeros(Q, U, F, dtype=dt), "alpha": torch.zeros(Q, U, dtype=dt),
         "logr": torch.full((Q, T), -math.inf, dtype=dt), "lt": torch.zeros(Q, U, dtype=torch.long),
         "G": torch.full((Q, T, U), _BIG, dtype=dt), "K": torch.zeros(Q, U, U, dtype=dt),
         "umask": torch.zeros(Q, U, dtype=torch.bool), "gold": torch.zeros(Q, U, dtype=torch.bool),
         "kappa": torch.zeros(Q, dtype=dt), "Bq": torch.zeros(Q, dtype=torch.long),
         "attrs": torch.zeros(Q, U, items[0].attrs.shape[1], dtype=dt),
         "now": torch.tensor([it.now for it in items], dtype=dt)}
    for i, it in enumerate(items):
        u, t = len(it.cand), len(it.r)
        b["X"][i] = torch.from_numpy(it.x)
        b["f"][i, :u] = torch.from_numpy(it.f)
        b["alpha"][i, :u] = torch.from_numpy(it.alpha)
        b["logr"][i, :t] = torch.from_numpy(np.log(np.maximum(it.r, 1e-300)))
        b["lt"][i, :u] = torch.from_numpy(it.lt)
        b["G"][i, :t, :u] = torch.from_numpy(it.G)
        b["K"][i, :u, :u] = torch.from_numpy(it.K)
        b["umask"][i, :u] = True
        b["gold"][i, :u] = torch.from_numpy(it.gold)
        b["attrs"][i, :u] = torch.from_numpy(it.attrs)
        Bq = effective_budget(budget, u)
        b["kappa"][i] = 1.0 / Bq
        b["Bq"][i] = Bq
    b["T"] = T
    return b


def make_batches(items: list[QItem], budget: int, chunk: int = 48) -> list[dict]:
    """Padded chunks of similar |U_q| (sorted by size, ties by input order)."""
    order = sorted(range(len(items)), key=lambda i: (len(items[i].cand), i))
    out = []
    for s in range(0, len(order), chunk):
        idx = order[s:s + chunk]
        b = _pad_batch([items[i] for i in idx], budget)
        b["index"] = idx
        b["n_gold"] = torch.tensor([items[i].n_gold for i in idx])
        out.append(b)
    return out


# ----------------------------------------------------------------------------------- surrogate
def surrogate(head: RoleHead, b: dict, cfg: SelectConfig) -> dict[str, torch.Tensor]:
    """Torch rho, phi, pi, thread mass, the modular part of J and its weights for a padded batch
    (see the module docstring); ``weights``: every ``QUERY_WEIGHTS`` name, the head's per-query
    ``[Q, 1]`` where it learns one, else the config's value."""
    delta, M, w = head(b["X"])
    um = b["umask"]
    weights = {k: (w[:, _IDX[k], None] if k in _IDX else float(getattr(cfg, k))) for k in QUERY_WEIGHTS}
    rho = torch.softmax(torch.einsum("quf,qkf->quk", b["f"], M) / cfg.T_R, dim=-1)
    phi = (rho * delta[:, None, :]).sum(-1)
    lam_m, lam_r, tau = w[:, _IDX["lambda_m"]], w[:, _IDX["lambda_r"]], w[:, _IDX["tau"]]
    C = b["G"] + lam_m[:, None, None] * (1.0 - b["alpha"])[:, None, :] + lam_r[:, None, None] * (1.0 - phi)[:, None, :]
    lw = torch.logsumexp(b["logr"][:, :, None] - C / tau[:, None, None], dim=1)  # [Q, U]
    wv = torch.minimum(torch.exp(lw), b["kappa"][:, None]) * um
    pi = wv / wv.sum(1, keepdim=True).clamp_min(1e-300)
    mass = torch.zeros(pi.shape[0], b["T"], dtype=pi.dtype).scatter_add(1, b["lt"], pi)
    modular = modular_gain(ModularInputs(b["alpha"], b["attrs"], b["now"][:, None]), weights, cfg)
    return {"delta": delta, "rho": rho, "phi": phi, "pi": pi, "mass": mass, "w": w, "weights": weights,
            "modular": modular}


def _coverage_data(s: dict, b: dict) -> CoverageData:
    """The coverage terms' batch data (``terms.CoverageData``: threads as columns + 1, a
    leading zero mass column) of a surrogate ``s`` over batch ``b``."""
    Q = s["pi"].shape[0]
    tcol = torch.where(b["umask"], b["lt"] + 1, torch.zeros_like(b["lt"]))
    mass = torch.cat([torch.zeros(Q, 1, dtype=s["mass"].dtype), s["mass"]], dim=1)
    return CoverageData(s["pi"], b["K"], s["rho"], s["delta"], tcol, mass, b.get("attrs"),
                        torch.where(b["umask"], b["alpha"], 0.0) if "alpha" in b else None)


_ALL = Pick(lambda x: x, lambda x: x)  # every unit of every query


def _gains(s: dict, d: CoverageData, state: list) -> torch.Tensor:
    """Marginal gains [Q, U] of every unit against the terms' ``state``."""
    w = s["weights"]
    g = [t.gains_t(d, st, _ALL) for t, st in zip(COVERAGE_TERMS, state)]
    return combine_gain(g, s["modular"], [w[t.weight] for t in COVERAGE_TERMS])


def greedy_unroll(head: RoleHead, b: dict, cfg: SelectConfig, steps: int, temp: float = 1.0, with_loss: bool = True,
                  loss_kind: str = "listwise"):
    """Greedy over ``steps`` steps with a loss at each; returns (loss sum, n terms, picks [Q, steps]).

    ``listwise``: ``-log sum_{gold free} softmax(z_t / temp)`` over the free units; ``pick``: only
    at steps whose pick is not gold, ``softplus((z_t(pick) - temp * logsumexp_{gold free} z_t / temp) / temp)``
    (the best free gold should have beaten the pick). z_t: gains standardised over the free units.
    """
    if loss_kind not in LOSS_KINDS:
        raise ValueError(f"loss_kind must be one of {LOSS_KINDS}, got {loss_kind!r}")
    s = surrogate(head, b, cfg)
    Q, U = b["umask"].shape
    if loss_kind == "topb" and with_loss:
        return topb_loss(s, b, temp) + (None,)
    d = _coverage_data(s, b)
    state = [t.init_t(d) for t in COVERAGE_TERMS]
    free = b["umask"].clone()
    gold = b["gold"]
    loss, n_terms = torch.zeros((), dtype=torch.float64), 0
    picks = torch.full((Q, steps), -1, dtype=torch.long)
    ninf = -math.inf
    for t in range(steps):
        active = free.any(1) & (t < b["Bq"])
        if not active.any():
            break
        g = _gains(s, d, state)
        with torch.no_grad():
            gd = torch.where(free, g.detach(), torch.full_like(g, ninf))
            u = gd.argmax(1)  # first maximal index: the reference greedy's tie rule (lowest index)
        u = torch.where(active, u, torch.full_like(u, -1))
        if with_loss:
            gf = free & active[:, None]
            live = active & (gold & free).any(1)
            if loss_kind == "pick":
                live = live & ~gold[torch.arange(Q), u.clamp_min(0)]
            if live.any():
                n = gf.sum(1, keepdim=True).clamp_min(1)
                mu = (g * gf).sum(1, keepdim=True) / n
                sd = torch.sqrt((((g - mu) * gf) ** 2).sum(1, keepdim=True) / n + 1e-12)
                z = torch.where(gf, (g - mu) / sd / temp, torch.full_like(g, ninf))
                zg = torch.where(gold & gf, z, torch.full_like(g, ninf))
                if loss_kind == "listwise":
                    lq = torch.logsumexp(z[live], 1) - torch.logsumexp(zg[live], 1)
                else:
                    zp = z.gather(1, u.clamp_min(0)[:, None]).squeeze(1)
                    lq = torch.nn.functional.softplus(zp[live] - torch.logsumexp(zg[live], 1))
                loss = loss + lq.sum()
                n_terms += int(live.sum())
        picks[:, t] = u
        uc, qi = u.clamp_min(0), torch.arange(Q)
        state = [t_.add_t(d, st, lambda x: x[qi, uc], active) for t_, st in zip(COVERAGE_TERMS, state)]
        a = active.nonzero().squeeze(1)
        free = free.clone()
        free[a, u[a]] = False
    return loss, n_terms, picks


def topb_loss(s: dict, b: dict, temp: float) -> tuple[torch.Tensor, int]:
    """Smooth recall@B of the greedy's persistent per-unit score: ``-log sigmoid((z_g - theta) / temp)``
    averaged over each question's gold candidates, summed over questions.

    The score is the first-step gain without the role term (role coverage saturates after the
    first pick of each role, the other three terms persist through the greedy), standardised
    over U_q; theta is the midpoint of the B_q-th and (B_q+1)-th largest scores (not detached,
    so the competitors at the boundary are pushed down as the gold is pushed up).
    """
    Q, U = b["umask"].shape
    um, gold = b["umask"], b["gold"]
    g = _gains(s, b, torch.zeros(Q, U, dtype=torch.float64), torch.ones(Q, 3, dtype=torch.float64),
               torch.zeros(Q, b["T"], dtype=torch.bool))
    n = um.sum(1, keepdim=True).clamp_min(1)
    mu = (g * um).sum(1, keepdim=True) / n
    sd = torch.sqrt((((g - mu) * um) ** 2).sum(1, keepdim=True) / n + 1e-12)
    z = torch.where(um, (g - mu) / sd, torch.full_like(g, -1e9))
    zs = torch.sort(z, dim=1, descending=True).values
    Bq = b["Bq"]
    idx = torch.stack([Bq - 1, torch.minimum(Bq, um.sum(1) - 1)], 1)
    theta = zs.gather(1, idx).mean(1, keepdim=True)
    live = (gold & um).any(1) & (um.sum(1) > Bq)
    if not live.any():
        return torch.zeros((), dtype=torch.float64), 0
    per = torch.nn.functional.softplus((theta - z) / temp) * gold
    lq = per.sum(1) / gold.sum(1).clamp_min(1)
    return lq[live].sum(), int(live.sum())


def torch_picks(head: RoleHead, batches: list[dict], cfg: SelectConfig, budget: int) -> dict[int, list[int]]:
    """Full torch greedy (``budget`` steps, no early stop): item index -> local picks in pick order.

    A fast monitor; the reference ``select_reference`` stays the statement of the selection.
    """
    out = {}
    with torch.no_grad():
        for b in batches:
            _, _, picks = greedy_unroll(head, b, cfg, budget, with_loss=False)
            for i, idx in enumerate(b["index"]):
                out[idx] = [int(u) for u in picks[i] if u >= 0]
    return out


# --------------------------------------------------------------------------------------- fit
def fit(items: list[QItem], cfg: SelectConfig | None = None, options: FitOptions | None = None, *,
        chunk: int = 48, conditional_weights: bool = True, progress: bool = True,
        params: QueryParams | None = None, **kw) -> tuple[RoleHead, dict]:
    """Train a fresh head on ``items`` (questions whose gold is outside U_q are skipped), prepared
    with the query parameters ``params`` (their pool budget sizes the priority cap and the steps).
    ``options``: the hyperparameters (:class:`~.defaults.FitOptions`), or its fields as keywords."""
    o = with_keywords("fit", FitOptions, options, kw)
    epochs, lr, seed, l2, temp, steps, loss_kind = o.epochs, o.lr, o.seed, o.l2, o.temp, o.steps, o.loss_kind
    cfg = (cfg or SelectConfig()).resolved()
    pool = (params or QueryParams()).pool_budget
    steps = pool if steps is None else int(steps)  # B, or B_T under a token budget
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    use = [it for it in items if it.gold.any()]
    head = RoleHead(cfg, conditional_weights=conditional_weights)
    batches = make_batches(use, pool, chunk)
    opt = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=lr)
    hist = {"step_loss": [], "epoch_loss": [], "epoch_seconds": []}
    t0 = time.perf_counter()
    bar = tqdm(total=epochs * len(batches), desc="train head", disable=not progress)
    for ep in range(epochs):
        order = torch.randperm(len(batches), generator=gen).tolist()
        tot, nt = 0.0, 0
        te = time.perf_counter()
        for bi in order:
            b = batches[bi]
            opt.zero_grad()
            loss_sum, n, _ = greedy_unroll(head, b, cfg, steps, temp, loss_kind=loss_kind)
            if n == 0:
                bar.update(1)
                continue
            loss = loss_sum / n + l2 * head.reg_loss()
            loss.backward()
            opt.step()
            hist["step_loss"].append(float(loss.detach()))
            tot += float(loss_sum.detach())
            nt += n
            bar.update(1)
            bar.set_postfix(epoch=ep + 1, loss=f"{tot / max(1, nt):.4f}")
        hist["epoch_loss"].append(tot / max(1, nt))
        hist["epoch_seconds"].append(time.perf_counter() - te)
    bar.close()
    hist.update({"n_questions": len(items), "n_used": len(use), "seconds": time.perf_counter() - t0,
                 "hyper": {"epochs": epochs, "lr": lr, "seed": seed, "l2": l2, "temp": temp, "steps": steps,
                           "chunk": chunk, "conditional_weights": conditional_weights,
                           "loss_kind": loss_kind}})
    head.eval()
    return head, hist


def plot_loss(hist: dict, path: str | Path, title: str = "role head training") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = np.arange(1, len(hist["step_loss"]) + 1)
    ax.plot(steps, hist["step_loss"], lw=0.8, alpha=0.5, label="minibatch")
    if hist["epoch_loss"]:
        per = len(hist["step_loss"]) / len(hist["epoch_loss"])
        ax.plot(per * np.arange(1, len(hist["epoch_loss"]) + 1), hist["epoch_loss"], "o-", label="epoch mean (no L2)")
    ax.set_xlabel("Adam step")
    ax.set_ylabel("listwise loss")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    tmp = Path(path).with_name(Path(path).name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def loss_png_path(out_path: str | Path) -> Path:
    """``head.safetensors`` -> ``head.loss.png`` (beside the head)."""
    p = Path(out_path)
    return p.with_name(p.stem + ".loss.png") if p.suffix else p.with_name(p.name + ".loss.png")


def load_dev(data_path: str | Path, build_cfg=None, progress: bool = False, categories=(1, 2, 3, 4),
             dayfirst: bool = False):
    """(convs, banks, Z) for ``data_path``: banks from the on-disk cache, questions encoded once."""
    from ..ingest.config import BuildConfig
    from ..encode import get_encoder
    from ..eval.retrieval import banks_for

    build_cfg = build_cfg or BuildConfig()
    enc = get_encoder(build_cfg.encoder)
    convs, banks, _ = banks_for(data_path, build_cfg, progress=progress, encoder=enc, dayfirst=dayfirst)
    qs = [q.question for c in convs for q in c.questions if q.category in categories and q.evidence]
    Z = enc.encode(qs, is_query=True, progress=progress, desc="encode questions")
    return convs, banks, Z


def train_head(data_path: str | Path, out_path: str | Path, options: FitOptions | None = None, *,
               conversations=None, budget: int = 16, progress: bool = True, select_cfg: SelectConfig | None = None,
               data=None, dayfirst: bool = False, **kw) -> dict:
    """Train a head on the gold evidence of ``data_path`` (optionally only ``conversations``), save it,
    with the hyperparameters ``options`` (:class:`~.defaults.FitOptions`, or its fields as keywords).

    Writes the head to ``out_path`` (safetensors) and its loss curve beside it
    (``loss_png_path(out_path)``). ``data``: optional preloaded ``(convs, banks, Z)``.
    Returns ``{"history", "head_sha256", "out", "loss_png", "summary"}``.
    """
    from ..paths import file_sha256

    o = with_keywords("train_head", FitOptions, options, kw)
    seed, epochs, lr, l2, temp, loss_kind = o.seed, o.epochs, o.lr, o.l2, o.temp, o.loss_kind
    cfg = select_cfg or SelectConfig()
    qp = QueryParams(budget=budget)
    convs, banks, Z = data if data is not None else load_dev(data_path, progress=progress, dayfirst=dayfirst)
    cats = (1, 2, 3, 4)
    rows = [c.bank_id for c in convs for q in c.questions if q.category in cats and q.evidence]
    keep_ids = None
    if conversations:
        keep_ids = [str(c).strip() for c in conversations if str(c).strip()]
        unknown = sorted(set(keep_ids) - {c.bank_id for c in convs})
        if unknown:
            from ..errors import InputError

            raise InputError(f"`conversations`: {unknown} not in {data_path} "
                             f"(has {[c.bank_id for c in convs]})")
    sel = [c for c in convs if keep_ids is None or c.bank_id in keep_ids]
    mask = np.array([keep_ids is None or r in keep_ids for r in rows], dtype=bool)
    items = prepare_items(sel, [b for b in banks if keep_ids is None or b.bank_id in keep_ids], Z[mask], cfg,
                          progress=progress, params=qp)
    # One intra-op thread: reductions then sum in one order, so a seed gives the same head on
    # any machine (the tensors are small; more threads buy nothing here).
    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        head, hist = fit(items, cfg, o, progress=progress, params=qp)
    finally:
        torch.set_num_threads(n_threads)
    head.meta = {"data_path": str(data_path), "data_sha256": file_sha256(data_path),
                 "conversations": [c.bank_id for c in sel], "seed": seed, "epochs": epochs, "lr": lr, "l2": l2,
                 "temp": temp, "steps": hist["hyper"]["steps"], "loss_kind": loss_kind, "budget": budget,
                 "n_questions": hist["n_questions"],
                 "n_used": hist["n_used"], "final_loss": hist["epoch_loss"][-1] if hist["epoch_loss"] else None,
                 "encoder": getattr(banks[0], "encoder_id", None)}
    digest = save_head(head, out_path)
    png = loss_png_path(out_path)
    plot_loss(hist, png, title=f"role head: {len(sel)} conversations, seed {seed}")
    return {"history": hist, "head_sha256": digest, "out": str(out_path), "loss_png": str(png),
            "summary": head.summary()}
