"""Real-chat views of a conversation set: the same conversations and questions, written the way
people chat (issue 36). Computed on the fly from the loaded conversations, never stored.

Benchmark corpora are tidier than real chats: LoCoMo's turns are single well-formed paragraphs,
LongMemEval's user turns long requests. Real chats are short messages, one thought often split
over several consecutive messages by one speaker, arriving minutes apart in bursts, informal
(typos, emoji, no punctuation). A view rewrites a set along those lines, so that a method's
margin can be measured where people talk like people. :data:`VIEWS`:

==========  =======================================================================================
``plain``   the conversations as loaded
``split``   each turn becomes its sentences (:func:`sentences`), sent as consecutive messages by
            the same speaker :data:`SPLIT_TIMING` apart (seconds); turns follow each other a reply
            gap apart (a minute or more); an image rides on the turn's last piece
``informal``  each turn, one message, lowercased, contracted (:data:`CONTRACTIONS`: "do not" ->
            "don't", "I am" -> "I'm") and without punctuation (:func:`informal`)
``chat``    ``split`` and ``informal`` together, with bursts minutes apart
            (:data:`CHAT_TIMING`: pieces 20 s to 3 min apart, replies 2 to 15 min), typos on
            :data:`TYPO_RATE` of the words of four letters or more and an emoji closing
            :data:`EMOJI_RATE` of the messages
==========  =======================================================================================

What every view keeps: the bank ids, the speakers, the sessions and their order, the questions
(asked as written: the questioner is not the chat), and the evidence: a gold turn's evidence maps
to **every** message it became (``D3:7`` -> ``D3:7.1``, ``D3:7.2``, ...; a turn that stays one
message keeps its id), so evidence recall over messages asks for the whole thought.

Time: a message's ``time`` is its session's time plus the view's gaps (each conversation's own
seeded draws, :data:`SEED`), so its gaps are the view's; a session whose messages would run past
midnight starts early enough to end before it (its date stays). ``timestamp`` stays the session's
text as the source wrote it, so the encoder sees the same date prefix as in the plain set.

Everything is deterministic: the draws come from ``random.Random`` seeded with the view's seed
and the bank id, never from global state.
"""
from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from ..errors import InputError
from .types import Conversation, Question, Turn

SEED = 36
"""The seed of every view's draws (with the bank id): one fixed set of gaps, typos and emoji."""

VIEWS: tuple[str, ...] = ("plain", "split", "informal", "chat")
"""The views, in table order (:func:`apply_view`)."""


@dataclass(frozen=True)
class Timing:
    """Gaps of a view, in seconds, each drawn uniformly: between the pieces of one turn and
    between turns (a reply, or the same speaker's next turn)."""

    piece: tuple[float, float]
    turn: tuple[float, float]


SPLIT_TIMING = Timing(piece=(2.0, 10.0), turn=(60.0, 180.0))
"""``split``: a thought typed out sentence by sentence, seconds apart; a reply a minute or more later."""
CHAT_TIMING = Timing(piece=(20.0, 180.0), turn=(120.0, 900.0))
"""``chat``: bursts minutes apart; replies 2 to 15 minutes later."""
TYPO_RATE = 0.03
"""``chat``: the share of words of four letters or more that get one typo (:func:`typo`)."""
EMOJI_RATE = 0.1
"""``chat``: the share of messages that end with an emoji."""
EMOJI = ("😂", "🙂", "😊", "👍", "❤️", "😅", "🙏", "😍")

_SENT = re.compile(r"(?<=[.!?…])[\"')\]]*[ \t]+(?=\S)|[ \t]*\n\s*")
_ABBREV = re.compile(r"(?:\b(?:mr|mrs|ms|dr|st|vs|etc|e\.g|i\.e|jr|sr|no|approx)|(?<!\w)[a-z]|(?<!\w)\d{1,2})[.]$", re.I)
_WORDY = re.compile(r"\w")


def sentences(text: str) -> list[str]:
    """``text`` cut into its sentences: after ``.``, ``!``, ``?`` or ``…`` (and any closing quote
    or bracket) and white space, or at a line break; not after a common abbreviation, a single
    letter or a one- or two-digit number (``Dr.``, ``e.g.``, ``J.``, ``3.``). A piece without a
    word character (``:)``) stays with the piece before it."""
    cuts, pos = [], 0
    for m in _SENT.finditer(text):
        if "\n" in m.group() or not _ABBREV.search(text[max(pos, m.start() - 8):m.start()].rstrip("\"')]")):
            cuts.append(text[pos:m.start()] + m.group().strip())
            pos = m.end()
    cuts.append(text[pos:])
    pieces: list[str] = []
    for p in (c.strip() for c in cuts):
        if not p:
            continue
        if pieces and not _WORDY.search(p):
            pieces[-1] += " " + p
        else:
            pieces.append(p)
    return pieces or [text]


CONTRACTIONS: tuple[tuple[str, str], ...] = (
    ("do not", "don't"), ("does not", "doesn't"), ("did not", "didn't"), ("is not", "isn't"),
    ("are not", "aren't"), ("was not", "wasn't"), ("were not", "weren't"), ("have not", "haven't"),
    ("has not", "hasn't"), ("had not", "hadn't"), ("will not", "won't"), ("would not", "wouldn't"),
    ("cannot", "can't"), ("can not", "can't"), ("could not", "couldn't"), ("should not", "shouldn't"),
    ("i am", "i'm"), ("you are", "you're"), ("we are", "we're"), ("they are", "they're"), ("it is", "it's"),
    ("that is", "that's"), ("there is", "there's"), ("what is", "what's"), ("i have", "i've"),
    ("you have", "you've"), ("we have", "we've"), ("i will", "i'll"), ("you will", "you'll"),
    ("we will", "we'll"), ("i would", "i'd"), ("let us", "let's"), ("going to", "gonna"), ("want to", "wanna"))
"""Contractions the ``informal`` view writes (on lowercased text, whole words)."""
_CONTRACT = re.compile(r"\b(" + "|".join(re.escape(a) for a, _ in CONTRACTIONS) + r")\b")
_CONTRACT_TO = dict(CONTRACTIONS)
_PUNCT = re.compile(r"[.,:](?!\d)|(?<!\d)[.,:]|[!?;\"“”‘’()\[\]…–—*_~]|(?<!\w)'|'(?!\w)")
_SPACES = re.compile(r"[ \t]+")


def informal(text: str) -> str:
    """``text`` as people type it: lowercased, contracted (:data:`CONTRACTIONS`), punctuation
    dropped (a ``.``, ``,`` or ``:`` between digits stays: ``3.5``, ``10:30``; an apostrophe inside
    a word stays: ``don't``), runs of spaces made one. Line breaks stay."""
    t = _CONTRACT.sub(lambda m: _CONTRACT_TO[m.group(1)], text.lower())
    t = _PUNCT.sub(" ", t)
    return "\n".join(_SPACES.sub(" ", line).strip() for line in t.split("\n")).strip()


def typo(word: str, rng: random.Random) -> str:
    """One typo in ``word``: two neighbouring letters swapped, a letter dropped or a letter
    doubled (one of the three, drawn from ``rng``), never the first letter."""
    i = rng.randrange(1, len(word) - 1)
    kind = rng.randrange(3)
    if kind == 0:
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if kind == 1:
        return word[:i] + word[i + 1:]
    return word[:i] + word[i] + word[i:]


def _typos(text: str, rng: random.Random, rate: float) -> str:
    return " ".join(typo(w, rng) if len(w) >= 4 and w.isalpha() and rng.random() < rate else w
                    for w in text.split(" "))


@dataclass(frozen=True)
class ViewSpec:
    """What a view does to each turn (see the module docstring)."""

    name: str
    split: bool = False
    informal: bool = False
    timing: Timing | None = None
    typo_rate: float = 0.0
    emoji_rate: float = 0.0

    def to_dict(self) -> dict:
        """The view's identity (a bank cache key: what its banks depend on), with :data:`SEED`."""
        return {"name": self.name, "split": self.split, "informal": self.informal, "seed": SEED,
                "timing": None if self.timing is None else [list(self.timing.piece), list(self.timing.turn)],
                "typo_rate": self.typo_rate, "emoji_rate": self.emoji_rate, "version": 1}


SPECS = {"plain": ViewSpec("plain"), "split": ViewSpec("split", split=True, timing=SPLIT_TIMING),
         "informal": ViewSpec("informal", informal=True),
         "chat": ViewSpec("chat", split=True, informal=True, timing=CHAT_TIMING, typo_rate=TYPO_RATE,
                          emoji_rate=EMOJI_RATE)}


def view_spec(name: str) -> ViewSpec:
    """The :class:`ViewSpec` of ``name``; ``InputError`` naming the views for an unknown one."""
    if name not in SPECS:
        raise InputError(f"unknown view {name!r} (choose from {', '.join(VIEWS)})")
    return SPECS[name]


def _pieces(t: Turn, spec: ViewSpec, rng: random.Random) -> list[str]:
    """The messages ``t`` becomes under ``spec`` (at least one)."""
    parts = sentences(t.text) if spec.split and t.text.strip() else [t.text]
    if spec.informal:
        parts = [informal(p) for p in parts]
        parts = [p for p in parts if p] or [""]
    if spec.typo_rate:
        parts = [_typos(p, rng, spec.typo_rate) for p in parts]
    if spec.emoji_rate:
        parts = [p + (" " + rng.choice(EMOJI) if rng.random() < spec.emoji_rate else "") for p in parts]
    return parts


def _session_times(turns: list[Turn], counts: list[int], timing: Timing, rng: random.Random) -> list[datetime | None]:
    """The times of one session's messages (``counts[i]`` pieces for its turn ``i``): the
    session's time plus the drawn gaps, moved early enough to end before midnight."""
    offs, t = [], 0.0
    for i, n in enumerate(counts):
        for k in range(n):
            if offs:
                t += rng.uniform(*(timing.piece if k else timing.turn))
            offs.append(t)
    base = turns[0].time
    if base is None:
        return [None] * len(offs)
    end_of_day = base.replace(hour=23, minute=59, second=59, microsecond=0)
    start = min(base, end_of_day - timedelta(seconds=offs[-1])) if offs else base
    start = max(start, base.replace(hour=0, minute=0, second=0, microsecond=0))
    return [start + timedelta(seconds=o) for o in offs]


def view_conversation(conv: Conversation, spec: ViewSpec) -> tuple[Conversation, dict[str, tuple[str, ...]]]:
    """``conv`` under ``spec``, and each turn id's new message ids."""
    if spec.name == "plain":
        return conv, {t.turn_id: (t.turn_id,) for t in conv.turns}
    rng = random.Random(f"{SEED}:{spec.name}:{zlib.crc32(conv.bank_id.encode())}:{conv.bank_id}")
    pieces = [_pieces(t, spec, rng) for t in conv.turns]
    times: list = [t.time for t, p in zip(conv.turns, pieces) for _ in p]
    if spec.timing is not None:
        times, lo = [], 0
        while lo < len(conv.turns):
            hi = lo
            while hi < len(conv.turns) and conv.turns[hi].session == conv.turns[lo].session:
                hi += 1
            times += _session_times(conv.turns[lo:hi], [len(p) for p in pieces[lo:hi]], spec.timing, rng)
            lo = hi
    out: list[Turn] = []
    ids: dict[str, tuple[str, ...]] = {}
    k = 0
    for t, ps in zip(conv.turns, pieces):
        new = [t.turn_id] if len(ps) == 1 else [f"{t.turn_id}.{j + 1}" for j in range(len(ps))]
        ids[t.turn_id] = tuple(new)
        for j, (tid, text) in enumerate(zip(new, ps)):
            out.append(replace(t, turn_id=tid, text=text, time=times[k],
                               caption=t.caption if j == len(ps) - 1 else None))
            k += 1
    return replace(conv, turns=out, questions=[_question(q, ids) for q in conv.questions]), ids


def _question(q: Question, ids: dict[str, tuple[str, ...]]) -> Question:
    return replace(q, evidence=tuple(i for e in q.evidence for i in ids.get(e, (e,))))


def apply_view(convs: list[Conversation], name: str) -> list[Conversation]:
    """``convs`` under the view ``name`` (:data:`VIEWS`); ``InputError`` for an unknown view."""
    spec = view_spec(name)
    return [view_conversation(c, spec)[0] for c in convs]
