"""``trawmem evolve-prompts``: the command line of ``eval.evolve``."""
from __future__ import annotations

from .args import add_llm_options, int_range, positive_int, token_budget_int


def cmd_evolve(a) -> int:
    from ..errors import InputError
    from ..llm.factory import llm_from_args, llm_options
    from ..eval.evolve import EvolveConfig, Evolution
    from ..ingest.layers.prompts import load_prompt_set

    if not a.llm or a.llm.strip().lower() == "none":
        raise InputError("--llm is required: evolution extracts, answers and critiques with an LLM")
    init = load_prompt_set(a.init) if a.init else None
    llm = llm_from_args(a.llm, check=True, **llm_options(a))
    judge = None
    try:
        if a.judge_llm:
            judge = llm if a.judge_llm.strip() == a.llm.strip() else llm_from_args(a.judge_llm, check=True,
                                                                                   **llm_options(a))
        cfg = EvolveConfig(data=a.data, steps=a.steps, max_failures=a.max_failures, budget=a.budget,
                           token_budget=a.token_budget, profiles=not a.no_profiles)
        ev = Evolution(cfg, a.out, llm, judge=judge, init=init, progress=print)
        st = ev.run()
    finally:
        for b in {id(x): x for x in (llm, judge) if x is not None}.values():
            b.close()
    best = st["versions"][st["best"]]
    print(f"{len(st['versions'])} versions in {a.out}; best: version {best['version']} (score {best['score']:.4f}) "
          f"-> {a.out}/best_prompts.json (use with `trawmem build --prompts`)")
    return 0


def configure(e) -> None:
    from ..llm.spec import SPEC_HELP

    e.describe("Evolve TriMem's extraction and profile prompts on a dev split: build the facts and profiles with "
               "the current prompts, answer every question from TriMem's workspace, ask the LLM to criticize the "
               "prompts in the light of the wrong answers and to rewrite them; repeat --steps times. Every version "
               "is written with its score (OUT/v<k>.json), the best as OUT/best_prompts.json; a killed run, rerun "
               "with the same arguments, continues where it stopped.")
    e.add_argument("--data", required=True, help="LoCoMo-layout JSON dev split with questions and answers")
    e.add_argument("--llm", required=True, help=f"the LLM that extracts, answers and critiques: {SPEC_HELP}")
    e.add_argument("--judge-llm", help=f"judge model ({SPEC_HELP}); the score is then LLM-judge accuracy "
                                       "(default: none, the score is the answers' LoCoMo F1)")
    e.add_argument("--steps", type=int_range(1, 20), default=4, help="evolution steps (the paper's best: 4)")
    e.add_argument("--max-failures", type=positive_int, default=8, metavar="N",
                   help="wrong answers shown to the critic per step")
    e.add_argument("--budget", type=positive_int, default=4096,
                   help="unit cap of each workspace (default: everything TriMem lists)")
    e.add_argument("--token-budget", type=token_budget_int, metavar="T", help="workspace token budget (default: no token budget)")
    e.add_argument("--no-profiles", action="store_true", help="evolve the extraction prompt alone (no profiles)")
    e.add_argument("--init", help="prompts file to start from (default: the built-in prompts)")
    e.add_argument("--out", required=True, help="run directory: versions, state, best prompts")
    add_llm_options(e)
    e.set_defaults(fn=cmd_evolve)
