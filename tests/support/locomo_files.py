"""Tiny made-up LoCoMo-layout files written into a test's ``tmp_path``."""
from __future__ import annotations

import json


SESSIONS = {
    "conv-a": ("Alice", "Bob", [
        ("2:14 pm on 9 May, 2031", [
            "Hi Bob! Yesterday I adopted a puppy, a golden retriever named Max.",
            "That's wonderful Alice, what breed is he?",
            "A golden retriever. He loves chasing tennis balls in the park.",
            "I started a pottery class last week, the answer is pottery.",
            "Pottery sounds relaxing. What did you make first?",
            "A blue bowl for my kitchen, it came out a bit lopsided.",
        ]),
        ("11:22 am on 26 June, 2031", [
            "Bob, I ran my first marathon in Boston last Sunday.",
            "Congratulations Alice! How long did it take you?",
            "Four hours and ten minutes, Max waited for me at the finish line.",
            "I am moving to Denver next month for a new job at a bakery.",
            "A bakery job suits you, you always loved baking bread.",
            "Yes, the answer is sourdough bread, I bake it every weekend.",
        ]),
    ]),
    "conv-b": ("Carol", "Dan", [
        ("9:15 am on 3 March, 2031", [
            "Dan, I finally bought a red bicycle, the answer is a red bicycle.",
            "Nice! Where will you ride it?",
            "Along the river trail near my apartment every morning.",
            "My sister Emma visited me from Lisbon last weekend.",
            "Did you show her around the city?",
            "We went to the science museum and ate at a ramen shop.",
        ]),
        ("4:02 pm on 20 April, 2031", [
            "Carol, I adopted two cats named Pepper and Salt.",
            "Two cats! How are they getting along with each other?",
            "They fight over the sunny spot by the window all day.",
            "I signed up for a photography course that starts in May.",
            "You should photograph the cats for practice.",
            "Good idea, I will bring my new camera to the river trail too.",
        ]),
    ]),
}

QA = {
    "conv-a": [
        {"question": "What pet did Alice adopt and what race did she run?", "answer": "a puppy, a marathon",
         "evidence": ["D1:1", "D2:1"], "category": 1},
        {"question": "When did Alice adopt the puppy?", "answer": "7 May 2031", "evidence": ["D1:1"], "category": 2},
        {"question": "What kind of bread might Alice bake at the bakery?", "answer": "sourdough bread",
         "evidence": ["D2:6"], "category": 3},
        {"question": "What class did Alice start?", "answer": "pottery", "evidence": ["D1:4"], "category": 4},
    ],
    "conv-b": [
        {"question": "What did Carol buy and who visited Carol?", "answer": "a red bicycle, Emma",
         "evidence": ["D1:1", "D1:4"], "category": 1},
        {"question": "When did Emma visit Carol?", "answer": "the weekend before 3 March 2031",
         "evidence": ["D1:4"], "category": 2},
        {"question": "Would Carol enjoy outdoor photography?", "answer": "yes; she rides the river trail",
         "evidence": ["D2:4", "D1:3"], "category": 3},
        {"question": "What are the names of Carol's cats?", "answer": "Pepper and Salt", "evidence": ["D2:1"],
         "category": 4},
        {"question": "What did Dan say about his dog?", "adversarial_answer": "a husky", "evidence": ["D2:1"],
         "category": 5},
    ],
}


def layout_sample(sample_id: str, speakers: tuple, sessions: list) -> dict:
    """A made-up sample in the LoCoMo layout: ``sessions`` is ``[(date text, [(speaker, text), ...])]``
    (turn ids ``D<session>:<n>``, as the layout numbers them)."""
    conv = {"speaker_a": speakers[0], "speaker_b": speakers[1]}
    for n, (date, turns) in enumerate(sessions, start=1):
        conv[f"session_{n}_date_time"] = date
        conv[f"session_{n}"] = [{"dia_id": f"D{n}:{i}", "speaker": who, "text": text}
                                for i, (who, text) in enumerate(turns, start=1)]
    return {"sample_id": sample_id, "qa": [], "conversation": conv}


def write_data(path):
    samples = []
    for sid, (a, b, sessions) in SESSIONS.items():
        conv = {"speaker_a": a, "speaker_b": b}
        for n, (date, turns) in enumerate(sessions, start=1):
            conv[f"session_{n}_date_time"] = date
            conv[f"session_{n}"] = [{"speaker": (a, b)[i % 2], "dia_id": f"D{n}:{i + 1}", "text": t}
                                    for i, t in enumerate(turns)]
        samples.append({"sample_id": sid, "conversation": conv, "qa": QA[sid]})
    path.write_text(json.dumps(samples))
    return path


def write_tiny_locomo(path, observation=True, extra_obs=None):
    """A made-up two-session conversation in the LoCoMo layout (no real data)."""
    sess1 = [("Ana", "I adopted a puppy called Rex last week."), ("Ben", "Nice, what breed is Rex?"),
             ("Ana", "A beagle. He loves the park by the river."), ("Ben", "I started a pottery class."),
             ("Ana", "Pottery sounds relaxing, what did you make?"), ("Ben", "A blue bowl for my mother.")]
    sess2 = [("Ben", "My pottery teacher moved to Lisbon."), ("Ana", "Rex chewed my hiking boots yesterday."),
             ("Ben", "Are you still planning the mountain hike?"), ("Ana", "Yes, in August with my sister."),
             ("Ben", "Take Rex along, beagles love trails."), ("Ana", "Good idea, I will buy him a harness.")]
    conv = {"speaker_a": "Ana", "speaker_b": "Ben",
            "session_1_date_time": "2:14 pm on 9 May, 2031", "session_2_date_time": "11:22 am on 26 June, 2031",
            "session_1": [{"speaker": s, "dia_id": f"D1:{i + 1}", "text": t} for i, (s, t) in enumerate(sess1)],
            "session_2": [{"speaker": s, "dia_id": f"D2:{i + 1}", "text": t} for i, (s, t) in enumerate(sess2)]}
    qa = [{"question": "What breed is Ana's dog and what did he chew?", "answer": "beagle, boots",
           "evidence": ["D1:3", "D2:2"], "category": 1},
          {"question": "When did Ana adopt Rex?", "answer": "early May 2031", "evidence": ["D1:1"], "category": 2},
          {"question": "Would Ben enjoy crafts?", "answer": "yes", "evidence": ["D1:4"], "category": 3},
          {"question": "What did Ben make in pottery class?", "answer": "a blue bowl", "evidence": ["D1:6"],
           "category": 4},
          {"question": "Who moved to Lisbon?", "answer": "the pottery teacher", "evidence": ["D2:1"], "category": 4},
          {"question": "What did Ana buy?", "adversarial_answer": "x", "evidence": ["D2:6"], "category": 5}]
    obs = {"session_1_observation": {"Ana": [["Ana adopted a beagle puppy named Rex.", "D1:1; D1:3"],
                                             ["Rex loves the park by the river.", ["D1:3"]]],
                                     "Ben": [["Ben takes a pottery class.", "D1:4"],
                                             ["Ben made a blue bowl for his mother.", "D1:6"],
                                             ["A fact citing nothing real.", "D9:9"]]},
           "session_2_observation": {"Ana": [["Rex chewed Ana's hiking boots.", "D2:2, D2:8"],
                                             ["Ana plans a mountain hike in August.", ["D2:3", "D2:4"]]],
                                     "Ben": [["Ben's pottery teacher moved to Lisbon.", "D2:1"]]}}
    if extra_obs:
        obs["session_2_observation"]["Ben"].append(extra_obs)
    sample = {"sample_id": "tiny-1", "conversation": conv, "qa": qa}
    if observation:
        sample["observation"] = obs
    path.write_text(json.dumps([sample]))
    return path


WORDS = "sailing harbour violin garden lantern bakery ferry orchard kite museum".split()


def _sample(n_sessions: int, per: int = 6) -> dict:
    """A made-up LoCoMo-layout sample (dates in 2031) with one observation per two turns."""
    conv = {"speaker_a": "Ana", "speaker_b": "Ben"}
    obs = {}
    for s in range(1, n_sessions + 1):
        conv[f"session_{s}_date_time"] = f"1:00 pm on {s + 2} May, 2031"
        conv[f"session_{s}"] = [{"speaker": "Ana" if i % 2 else "Ben", "dia_id": f"D{s}:{i}",
                                 "text": f"Talk {s}.{i} about the {WORDS[(s * 3 + i) % len(WORDS)]} again."}
                                for i in range(1, per + 1)]
        obs[f"session_{s}_observation"] = {
            "Ana": [[f"Ana spoke of the {WORDS[(s * 3 + i) % len(WORDS)]} in session {s}.", f"D{s}:{i}"]
                    for i in range(1, per + 1, 2)],
            "Ben": [[f"Ben and Ana met twice in session {s}.", [f"D{s}:2", f"D{s}:4"]]]}
    return {"sample_id": "made-up", "conversation": conv, "observation": obs,
            "qa": [{"question": "Where?", "answer": "x", "evidence": ["D1:1"], "category": 1}]}
