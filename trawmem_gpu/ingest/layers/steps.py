"""The build steps of the ingest layers, in their order (facts, then profiles, which are made from
the facts): what ``trawmem build`` (``cli/build.py``), its ``--update``, ``Memory.add``
(:class:`AddLayers`) and prompt evolution (``eval.evolve``) run. A layer's records, files, forget
and view are the store's (``store.layers``); how it is made, from the turns with an LLM or from an
input file, is here, one :class:`Step` per layer in :data:`STEPS`.

A layer's **source** says how it was made (``"llm"``, ``"locomo"``; ``"none"``: not built) and is
recorded in the bank (``Bank.layer_sources``), so an update continues with it:
:func:`build_layers` makes the layers of fresh banks, :func:`update_layers` extends those of an
updated bank over its new turns. ``Memory.add`` runs a bank's layers as ``build --update`` would,
with the Memory's LLM (``MemoryOptions.llm``); a layer read from an input file (``locomo``: the
observations of a LoCoMo file) has nothing to read there and is left as it is (module
``AddLayers``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...errors import ConfigError
from ...store.layers import LAYER_BY_NAME


@dataclass(frozen=True)
class StepRun:
    """What a build hands the steps: the bank's encoder, the LLM (None: none), the prompts
    (``ingest.layers.prompts.PromptSet``; None: the built-in ones), the input file and how its
    dates read (``--facts locomo`` reads it)."""

    encoder: object
    llm: object = None
    prompts: object = None
    input_path: object = None
    dayfirst: bool = False


@dataclass(frozen=True)
class Step:
    """How one layer (``store.layers``, by ``layer``) is built from a source, and updated."""

    layer: str
    sources: tuple[str, ...]
    """The sources it is built from besides ``none`` (``--facts llm``, ``--facts locomo``)."""
    build: Callable
    """``(banks, source, run) -> (banks, stats)``."""
    update: Callable
    """``(old, bank, source, run, new_turns) -> (bank, stats)``: ``bank`` (``old`` with the turns
    ``new_turns`` appended) with its layer extended over them."""
    from_input: tuple[str, ...] = ()
    """The sources read from the input file (not from the turns): ``Memory.add`` has none."""
    check_update: Callable | None = None
    """``(old, source, run) -> None``: refuse an update before anything is computed (an
    ``InputError``: the input conflicts with the bank's layer)."""

    def needs(self, source: str, run: StepRun) -> str | None:
        """Why the step cannot run from ``source`` with ``run`` (None: it can)."""
        if source == "llm" and run.llm is None:
            return "needs an LLM (`llm`)"
        if source in self.from_input and run.input_path is None:
            return f"reads {source!r} from an input file, which an add has not"
        return None


def _facts_build(banks, source, run):
    from .facts import attach_facts

    return attach_facts(banks, source, run.encoder, input_path=run.input_path, llm=run.llm, dayfirst=run.dayfirst,
                        prompts=run.prompts)


def _facts_update(old, bank, source, run, new_turns):
    from .facts import attach_facts

    (bank,), st = attach_facts([bank], source, run.encoder, input_path=run.input_path, llm=run.llm,
                               dayfirst=run.dayfirst, new_turns={bank.bank_id: list(new_turns)}, prompts=run.prompts)
    return bank, st


def _facts_check_update(old, source, run):
    if source == "locomo":  # the old observations must be the bank's facts, new turns or not
        from .facts import check_locomo_update

        check_locomo_update(old, run.input_path, dayfirst=run.dayfirst)


def _profiles_build(banks, source, run):
    from .profiles import attach_profiles

    made = [attach_profiles(b, run.llm, run.encoder, prompts=run.prompts) for b in banks]
    return [b for b, _ in made], [s for _, s in made]


def _profiles_update(old, bank, source, run, new_turns):
    from .profiles import attach_profiles

    return attach_profiles(bank, run.llm, run.encoder, prompts=run.prompts,
                           new_fact_ids=[f.fact_id for f in bank.facts[len(old.facts):]])  # the new facts' sections


STEPS: tuple[Step, ...] = (
    Step("facts", ("locomo", "llm"), _facts_build, _facts_update, from_input=("locomo",),
         check_update=_facts_check_update),
    Step("profiles", ("llm",), _profiles_build, _profiles_update),
)
"""The layers' steps, in the order they are built (a layer after those it requires)."""
STEP_BY_LAYER: dict[str, Step] = {s.layer: s for s in STEPS}


def _check_steps() -> None:
    """Each step builds a store layer, after the layers that one requires."""
    for k, s in enumerate(STEPS):
        if s.layer not in LAYER_BY_NAME:
            raise ValueError(f"step {s.layer!r} builds no layer of store.layers")
        late = [r for r in LAYER_BY_NAME[s.layer].requires if r in STEP_BY_LAYER
                and STEPS.index(STEP_BY_LAYER[r]) > k]
        if late:
            raise ValueError(f"step {s.layer!r} runs before {late[0]!r}, which its layer requires")


_check_steps()


def sources_of(given: dict, old=None, *, requires: bool = True) -> dict[str, str]:
    """Each layer's source: the one ``given`` (``{"facts": "llm"}``; None: not given), else the
    bank's own (``old.layer_sources``, an update), else ``none``; a source a step does not know,
    or (``requires``) a layer from a source whose required layer is not built (a fresh build), is
    a ``ConfigError`` naming the layer."""
    out = {}
    for s in STEPS:
        src = given.get(s.layer) or (old.layer_sources.get(s.layer, "none") if old is not None else "none")
        if src not in ("none", *s.sources):
            raise ConfigError(f"`{s.layer}` must be one of {', '.join(('none', *s.sources))} (got {src!r})")
        if requires and old is None and src != "none":
            for r in LAYER_BY_NAME[s.layer].requires:
                if out.get(r, "none") == "none":
                    alts = " or ".join(f"`{r}` {x}" for x in STEP_BY_LAYER[r].sources)
                    raise ConfigError(f"`{s.layer}` {src} builds {s.layer} from {r}: give {alts}")
        out[s.layer] = src
    return out


def needs_llm(sources: dict) -> bool:
    """Whether a layer of ``sources`` is made by an LLM."""
    return "llm" in sources.values()


def build_layers(banks: list, sources: dict, run: StepRun) -> tuple[list, dict]:
    """Fresh ``banks`` with their layers made from ``sources`` (:func:`sources_of`), in
    :data:`STEPS` order; and each run step's stats by layer."""
    stats = {}
    for s in STEPS:
        if sources.get(s.layer, "none") != "none":
            banks, stats[s.layer] = s.build(banks, sources[s.layer], run)
    return list(banks), stats


def check_update(old, sources: dict, run: StepRun) -> None:
    """Refuse an update of ``old`` whose input conflicts with its layers (each step's
    ``check_update``), before anything is computed."""
    for s in STEPS:
        if s.check_update is not None and sources.get(s.layer, "none") != "none":
            s.check_update(old, sources[s.layer], run)


def update_layers(old, bank, new_turns, sources: dict, run: StepRun) -> tuple[object, dict]:
    """``bank`` (``old`` with ``new_turns`` appended) with its layers extended over the new turns,
    in :data:`STEPS` order; and each run step's stats by layer."""
    stats = {}
    for s in STEPS:
        if sources.get(s.layer, "none") != "none":
            bank, stats[s.layer] = s.update(old, bank, sources[s.layer], run, new_turns)
    return bank, stats


class AddLayers:
    """``Memory.add``'s layer steps (``memory.banks.BankRegistry.append`` calls it with the bank as
    stored, the bank with the new turns, and those turns): the layers the stored bank was built
    with (its ``layer_sources``), run as ``build --update`` runs them.

    ``mode`` True: every one of them runs, or the add is refused (``ConfigError`` naming
    ``layers``; nothing stored) when one cannot: an LLM layer without an LLM, a layer read from an
    input file. ``mode`` None: those that can run do, and the others (and the layers requiring
    them) are left as they are, said in :attr:`report`. A layer made otherwise than by a step
    (facts of ``Memory.add_facts``, source ``api``) is always left. A bank an add creates has no layers.
    :attr:`report`: per layer, its source and whether it ran (``ran``; ``why`` not; the stats of
    the step: ``facts_added``, profile counts)."""

    def __init__(self, run: StepRun, mode: bool | None = None):
        self.run, self.mode = run, mode
        self.report: dict = {}

    def __call__(self, old, bank, new_turns):
        self.report = {}
        sources = {s.layer: old.layer_sources.get(s.layer, "none") for s in STEPS}
        left = set()
        for s in STEPS:
            src = sources[s.layer]
            if src == "none":
                continue
            built = src in s.sources  # else made otherwise (``Memory.add_facts``: "api"): no step to run
            why = s.needs(src, self.run) if built else f"made by {src!r}, not by a build step"
            if why is None and left & set(LAYER_BY_NAME[s.layer].requires):
                why = f"its {sorted(left & set(LAYER_BY_NAME[s.layer].requires))[0]} were not run"
            if why is not None:
                if self.mode and built:
                    raise ConfigError(f"`layers`: bank {old.bank_id!r} was built with {s.layer} from {src!r}, which "
                                      f"{why}; add with `layers` False to leave them as they are (nothing was stored)")
                left.add(s.layer)
                self.report[s.layer] = {"source": src, "ran": False, "why": why}
                continue
            if s.check_update is not None:
                s.check_update(old, src, self.run)
            bank, st = s.update(old, bank, src, self.run, new_turns)
            self.report[s.layer] = {"source": src, "ran": True, **_counts(st)}
        return bank


def add_layers(mode, encoder, llm=None) -> AddLayers | None:
    """``Memory.add``'s layer steps for its ``layers`` argument (None for False); an
    ``InputError`` naming ``layers`` for anything but True, False or None."""
    from ...errors import InputError

    if mode is not None and not isinstance(mode, bool):
        raise InputError(f"layers: expected True, False or None, got {type(mode).__name__}")
    return AddLayers(StepRun(encoder, llm), mode) if mode is not False else None


def _counts(st) -> dict:
    """A step's stats as plain numbers (a dict's, or a stats object's ``to_dict``)."""
    d = st.to_dict() if hasattr(st, "to_dict") else dict(st)
    return {k: v for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
