"""Real-chat views (data.chat_views) and the burst rule (data.bursts): how a conversation is
rewritten the way people chat, and how its messages group into bursts again."""
from datetime import datetime, timedelta

import numpy as np
import pytest

from trawmem_gpu.data import Conversation, Question, Turn, load_conversations
from trawmem_gpu.data.bursts import MAX_BURST_WORDS, burst_gap, burst_starts
from trawmem_gpu.data.chat_views import (SPLIT_TIMING, VIEWS, apply_view, informal, sentences, view_conversation,
                                         view_spec)
from trawmem_gpu.errors import InputError

T0 = datetime(2023, 5, 8, 13, 56)


def _conv():
    turns = [Turn("D1:1", "Ana", "Hi Ben! How are you? I do not know what to cook tonight.", 1, "8 May", T0),
             Turn("D1:2", "Ben", "Try the lasagna from Dr. Rossi's book.", 1, "8 May", T0, "a photo of a book"),
             Turn("D2:1", "Ana", "It was great. Thanks!", 2, "9 May", T0 + timedelta(days=1))]
    return Conversation("c1", turns, ("Ana", "Ben"), [Question("q1", "What did Ana cook?", "lasagna", ("D1:1", "D2:1"), 1)])


def test_sentences_cut_at_sentence_ends_not_at_abbreviations():
    assert sentences("Hey Mel! How are you? I saw Dr. Smith, e.g. at 3. ok") == \
        ["Hey Mel!", "How are you?", "I saw Dr. Smith, e.g. at 3. ok"]
    assert sentences("It was \"great.\" Then home.") == ["It was \"great.\"", "Then home."]
    assert sentences("List:\n1. apples\n2. pears") == ["List:", "1. apples", "2. pears"]
    assert sentences("Wow! :)") == ["Wow! :)"]  # a piece without a word stays with the one before
    assert sentences("one sentence") == ["one sentence"]


def test_informal_lowercases_contracts_and_drops_punctuation():
    assert informal("I do not know, it is 10:30. I am tired... (really!)") == "i don't know it's 10:30 i'm tired really"
    assert informal("Pi is 3.14, isn't it?") == "pi is 3.14 isn't it"


def test_split_view_maps_evidence_to_every_piece_and_keeps_the_rest():
    conv, ids = view_conversation(_conv(), view_spec("split"))
    assert ids["D1:1"] == ("D1:1.1", "D1:1.2", "D1:1.3") and ids["D1:2"] == ("D1:2",)
    assert [t.turn_id for t in conv.turns] == ["D1:1.1", "D1:1.2", "D1:1.3", "D1:2", "D2:1.1", "D2:1.2"]
    assert conv.questions[0].evidence == ("D1:1.1", "D1:1.2", "D1:1.3", "D2:1.1", "D2:1.2")
    assert conv.questions[0].question == "What did Ana cook?"  # questions are asked as written
    assert [t.speaker for t in conv.turns[:3]] == ["Ana"] * 3 and conv.turns[3].caption == "a photo of a book"
    assert {t.timestamp for t in conv.turns[:4]} == {"8 May"}  # the source's date text stays
    gaps = [(b.time - a.time).total_seconds() for a, b in zip(conv.turns, conv.turns[1:4])]
    assert all(SPLIT_TIMING.piece[0] <= g <= SPLIT_TIMING.piece[1] for g in gaps[:2])
    assert SPLIT_TIMING.turn[0] <= gaps[2] <= SPLIT_TIMING.turn[1]
    assert all(t.time.date() == t0.time.date() for t, t0 in zip(conv.turns[:4], [_conv().turns[0]] * 4))


def test_views_are_deterministic_and_plain_is_the_input():
    a, b = apply_view([_conv()], "chat"), apply_view([_conv()], "chat")
    assert a[0].turns == b[0].turns
    assert all(t.text == t.text.lower() for t in a[0].turns)
    c = _conv()
    assert apply_view([c], "plain")[0] is c
    assert set(VIEWS) == {"plain", "split", "informal", "chat"}
    with pytest.raises(InputError, match="unknown view 'tidy'"):
        apply_view([c], "tidy")


def test_a_session_near_midnight_keeps_its_date():
    late = datetime(2023, 5, 8, 23, 58)
    turns = [Turn(f"D1:{i}", "AB"[i % 2], "One. Two. Three. Four.", 1, "8 May", late) for i in range(20)]
    conv, _ = view_conversation(Conversation("c", turns), view_spec("chat"))
    assert {t.time.date() for t in conv.turns} == {late.date()}
    assert conv.turns == sorted(conv.turns, key=lambda t: t.time)


# ---------------------------------------------------------------------------------------------
# bursts
# ---------------------------------------------------------------------------------------------
def test_burst_gap_splits_seconds_from_minutes_and_gives_up_on_one_group():
    assert burst_gap(np.array([3, 5, 8, 90, 120, 4, 6, 150, 2])) == pytest.approx(np.sqrt(9 * 91) - 1)
    assert burst_gap(np.array([0.0, 0.0, 0.0])) == np.inf  # one time for the session: no timing
    assert burst_gap(np.array([60, 61, 70, 65])) == np.inf  # groups less than 3x apart
    assert burst_gap(np.array([np.nan, np.nan])) == np.inf


def _msgs(spec, t0=T0):
    """[(speaker, words, seconds after the previous)] -> turns of one session."""
    out, t = [], t0
    for i, (s, w, dt) in enumerate(spec):
        t = t + timedelta(seconds=dt)
        out.append(Turn(f"m{i}", s, " ".join(["word"] * w), 1, "x", t))
    return out


def test_short_messages_of_one_speaker_within_the_gap_form_a_burst():
    turns = _msgs([("A", 5, 0), ("A", 4, 3), ("A", 6, 5), ("B", 5, 120), ("B", 3, 4), ("A", 5, 200), ("A", 5, 150)])
    assert burst_starts(turns) == [0, 3, 5, 6]  # the last A message came minutes later: its own burst


def test_without_times_only_short_messages_between_speakers_burst():
    assert burst_starts(_msgs([("A", 30, 0), ("A", 30, 0), ("B", 30, 0)])) == [0, 1, 2]  # long messages
    assert burst_starts(_msgs([("A", 3, 0), ("A", 3, 0), ("A", 3, 0)])) == [0, 1, 2]  # one speaker's log
    two = _msgs([("A", 3, 0), ("A", 3, 0), ("B", 4, 0)]) + [Turn("n", "A", "a b c", 2, "y", T0)]
    assert burst_starts(two) == [0, 2, 3]  # turn taking ends a burst, and so does a session


def test_with_times_the_gap_decides_whatever_the_length():
    turns = _msgs([("A", 30, 0), ("A", 30, 4), ("A", 30, 200), ("A", 30, 3), ("A", 25, 150)])
    assert burst_starts(turns) == [0, 2, 4]


def test_a_burst_stops_at_its_word_cap():
    turns = _msgs([("A", 10, 0)] + [("A", 10, 1)] * 20)
    starts = burst_starts(turns)
    sizes = np.diff(starts + [len(turns)]) * 10
    assert len(starts) > 1 and sizes.max() <= MAX_BURST_WORDS


def test_the_split_view_of_a_dialogue_groups_back_into_its_turns():
    conv, ids = view_conversation(_conv(), view_spec("split"))
    starts = burst_starts(conv.turns)
    groups = [tuple(t.turn_id for t in conv.turns[a:b]) for a, b in zip(starts, starts[1:] + [len(conv.turns)])]
    assert groups == [ids[t.turn_id] for t in _conv().turns]


def test_dev_locomo_split_bursts_rebuild_its_turns(dev_path):
    """On LoCoMo dev, the split view's bursts are its turns again (the rule reads the gaps the view
    drew; a few turns longer than the cap, or whose sentences run long, stay apart)."""
    convs = load_conversations(dev_path)
    same = total = 0
    for c in convs:
        v, ids = view_conversation(c, view_spec("split"))
        starts = burst_starts(v.turns)
        got = {tuple(t.turn_id for t in v.turns[a:b]) for a, b in zip(starts, starts[1:] + [len(v.turns)])}
        same += sum(ids[t.turn_id] in got for t in c.turns)
        total += len(c.turns)
    assert same / total >= 0.95, same / total
