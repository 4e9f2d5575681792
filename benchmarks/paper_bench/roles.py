"""Fig. 7 (role shifts between direct and bridging questions) and Fig. 9 (coverage and
redundancy against B)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from .common import ci, grid_figure, save_figure
from .paper import CATS, PAPER, WHY, B


def fig7(runner_by_mode: dict, items, banks, out: Path) -> dict:
    from trawmem_gpu.eval.analyses import anchor_bridge_pairs

    res = {"paper": PAPER["fig7"], "roles": ["anchor", "bridge", "context"], "budget": B,
           "pair_definition": "unit v with gold(q_A) = {v} and v in gold(q_B), |gold(q_B)| >= 2, same conversation, "
                              "v selected by both; delta = rho_qB(v) - rho_qA(v)",
           "why": [WHY["fig7"]], "modes": {}}
    for mode, runner in runner_by_mode.items():
        sel_of, qs = {}, []
        for (bid, q), sel in zip(items, runner.selections):
            idx = banks[bid].index_of()
            sel_of[q.qid] = sel
            qs.append({"qid": q.qid, "bank_id": bid, "gold": [idx[t] for t in q.evidence], "selected": sel.units})
        pairs = anchor_bridge_pairs(qs)
        loose = anchor_bridge_pairs(qs, require_selected=False)
        ra, rb = [], []
        for p in pairs:
            for sel, acc in ((sel_of[p.q_direct], ra), (sel_of[p.q_bridge], rb)):
                pos = int(np.searchsorted(sel.candidates, p.unit))
                assert sel.candidates[pos] == p.unit
                acc.append(sel.rho[pos].tolist())
        ra, rb = np.array(ra).reshape(-1, 3), np.array(rb).reshape(-1, 3)
        d = rb - ra
        order = np.argsort(ra[:, 0], kind="stable") if len(ra) else np.array([], dtype=int)
        cat = {q.qid: q.category for _, q in items}
        res["modes"][mode] = {
            "pairs": len(pairs), "pairs_without_selection_requirement": len(loose),
            "q_direct_categories": {str(c): sum(cat[p.q_direct] == c for p in pairs) for c in CATS},
            "q_bridge_categories": {str(c): sum(cat[p.q_bridge] == c for p in pairs) for c in CATS},
            "delta_mean": d.mean(0).tolist() if len(d) else None,
            "delta_median": np.median(d, 0).tolist() if len(d) else None,
            "share_delta_positive": (d > 0).mean(0).tolist() if len(d) else None,
            "rho_direct_mean": ra.mean(0).tolist() if len(ra) else None,
            "rho_bridge_mean": rb.mean(0).tolist() if len(rb) else None,
            "per_pair_sorted_by_anchor_direct": {"rho_direct": ra[order].round(6).tolist(),
                                                 "rho_bridge": rb[order].round(6).tolist()}}
    modes = list(runner_by_mode)
    fig, axes = grid_figure(len(modes), 3, 15, 3.8)
    for k, mode in enumerate(modes):
        m = res["modes"][mode]
        ra = np.array(m["per_pair_sorted_by_anchor_direct"]["rho_direct"]).reshape(-1, 3)
        rb = np.array(m["per_pair_sorted_by_anchor_direct"]["rho_bridge"]).reshape(-1, 3)
        x = np.arange(len(ra))
        for r, name in enumerate(res["roles"]):
            ax = axes[k, r]
            ax2 = ax.twinx()
            ax2.bar(x, rb[:, r] - ra[:, r] if len(ra) else [], color="C2", alpha=0.25, width=1.0)
            ax2.set_ylabel("delta rho (q_B - q_A)", fontsize=8)
            ax.plot(x, ra[:, r] if len(ra) else [], "o-", ms=3, lw=0.6, color="C0", label="q_A (direct)")
            ax.plot(x, rb[:, r] if len(rb) else [], "s--", ms=3, lw=0.6, mfc="none", color="C3",
                    label="q_B (bridging)")
            ax.set_ylim(0, 1)
            dm = m["delta_mean"][r] if m["delta_mean"] else float("nan")
            ax.set_title(f"{mode}: {name}, mean delta {dm:+.3f} over {m['pairs']} pairs", fontsize=9)
            ax.set_xlabel("pairs, ordered by anchor weight under q_A")
            ax.set_ylabel(f"rho {name}")
            if r == 0:
                ax.legend(fontsize=7, loc="upper left")
    save_figure(fig, out, "paper_fig7", res=res, title=
          "Fig. 7 reproduced: role weights of the same unit under a direct and a bridging question")
    return res


# ----------------------------------------------------------------------------------------------
# Fig. 9

def fig9(args, modes: dict, items, banks, ctxs, Z, out: Path) -> dict:
    """``modes``: name -> (``SelectConfig``, ``QueryParams``); TrawMem runs at each B of
    ``--fig9-budgets`` with the mode's other query parameters."""
    from tqdm.auto import tqdm

    from trawmem_gpu.encode import get_encoder
    from trawmem_gpu.eval.analyses import (
        citation_matrix,
        fact_coverage,
        fact_mentions,
        load_observation_facts,
        relevant_facts,
    )
    from trawmem_gpu.select.baselines import cosine_topk, hybrid_topk
    from trawmem_gpu.select.reference import select_reference

    facts = load_observation_facts(args.data, {b: bank.index_of() for b, bank in banks.items()})
    enc = get_encoder(banks[next(iter(banks))].build_config.get("encoder", "minilm"))
    ment, cit, theta = {}, {}, {}
    for bid, f in facts.items():
        fv = enc.encode(f.texts)
        ment[bid], theta[bid] = fact_mentions(fv, banks[bid].unit_vecs, f.cited)
        cit[bid] = citation_matrix(f.cited, banks[bid].n_units)
    keep, rel = [], []
    for i, (bid, q) in enumerate(items):
        idx = banks[bid].index_of()
        r = relevant_facts(facts[bid].cited, [idx[t] for t in q.evidence]) if bid in facts else np.zeros(0, int)
        if r.size:
            keep.append(i)
            rel.append(r)
    methods = ["random", "cosine", "hybrid"] + [f"trawmem ({m})" for m in modes]
    rng = np.random.default_rng(0)
    acc = {m: {b: {"retained": [], "repeats": [], "retained_cited": []} for b in args.fig9_budgets} for m in methods}
    for b in tqdm(args.fig9_budgets, desc="fig9 budgets"):
        for i, r in zip(keep, rel):
            bid, q = items[i]
            ctx = ctxs[bid]
            picks = {"cosine": [cosine_topk(ctx, Z[i], b)], "hybrid": [hybrid_topk(ctx, q.question, Z[i], b)],
                     "random": [rng.choice(banks[bid].n_units, min(b, banks[bid].n_units), replace=False)
                                for _ in range(args.random_draws)]}
            for mode, (cfg, params) in modes.items():
                picks[f"trawmem ({mode})"] = [select_reference(ctx, q.question, Z[i], cfg, replace(params, budget=b)).units]
            for m, sels in picks.items():
                got = np.array([fact_coverage(s, ment[bid], r) + fact_coverage(s, cit[bid], r)[:1] for s in sels],
                               dtype=float).mean(0)
                a = acc[m][b]
                a["retained"].append(got[0])
                a["repeats"].append(got[1])
                a["retained_cited"].append(got[2])
    clusters = [items[i][0] for i in keep]
    curves = {m: {str(b): {k: ci(v, clusters) for k, v in acc[m][b].items()} for b in args.fig9_budgets}
              for m in methods}
    res = {"paper": PAPER["fig9"], "budgets": list(args.fig9_budgets), "methods": methods, "why": [WHY["fig9"]],
           "questions": len(keep), "questions_without_relevant_fact": len(items) - len(keep),
           "facts": {bid: {"n": len(f), "dropped": f.dropped, "theta": theta[bid]} for bid, f in facts.items()},
           "random_draws": args.random_draws,
           "definitions": {
               "fact": "one entry of LoCoMo's per-session 'observation' field, with the turns it cites",
               "relevant": "a fact is relevant to a question when it cites at least one of the question's gold "
                           "evidence turns; questions with no relevant fact are left out",
               "mention": "a unit mentions a fact when the fact cites it, or when the unit's MiniLM cosine to the "
                          "fact's text is at least that of the fact's best cited turn and at least theta, the "
                          "median of that own-source cosine over the conversation's facts",
               "retained": "relevant facts mentioned by at least one selected unit (retained_cited: by a cited turn)",
               "repeats": "over all facts of the conversation, selected units beyond the first mentioning the same "
                          "fact: sum_f max(0, mentions_f - 1)",
               "selection": "each method's first B units: random (uniform over the conversation, mean of "
                            "random_draws draws), top-B cosine, top-B RRF hybrid, TrawMem run at budget B"},
           "curves": curves}
    _plot_fig9(res, args.fig9_budgets, len(keep), out)
    return res


def _plot_fig9(res: dict, budgets, n_questions: int, out: Path) -> None:
    """Fig. 9's three panels (retained, retained by cited turns, repeats) against B, with 95% bands."""
    curves, methods = res["curves"], res["methods"]
    fig, axes = grid_figure(1, 3, 16, 4.6)
    axes = axes[0]
    for ax, key, lab in zip(axes, ("retained", "retained_cited", "repeats"),
                            ("(a) distinct relevant facts retained per query", "(a') ... counting cited turns only",
                             "(b) repeated fact mentions per query")):
        for j, m in enumerate(methods):
            mu = [curves[m][str(b)][key]["mean"] for b in budgets]
            lo = [curves[m][str(b)][key]["ci95"][0] for b in budgets]
            hi = [curves[m][str(b)][key]["ci95"][1] for b in budgets]
            ax.plot(budgets, mu, marker="o", ms=3, label=m, color=f"C{j}")
            ax.fill_between(budgets, lo, hi, color=f"C{j}", alpha=0.12)
        ax.set_xlabel("budget B (selected units)")
        ax.set_title(lab, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    save_figure(fig, out, "paper_fig9", res=res,
                title=f"Fig. 9 reproduced: coverage and redundancy vs B ({n_questions} questions with a "
                      f"relevant observation fact; bands: 95% CI, conversations resampled)")


# ----------------------------------------------------------------------------------------------
# Table 3
