"""The OpenAI Agents SDK session's items: which become turns, and the log that keeps them all.

* **Turns.** An item of type ``message`` (or without a type) whose role is ``user`` or
  ``assistant`` and whose content holds text (a string, or parts of type ``input_text`` /
  ``output_text`` / ``text``) becomes one chat message for ``Memory.add(messages=...)``, with the
  turn id ``oa-<seq>`` (``seq``: the item's number in its session, never reused) and the
  metadata ``{"oa_seq": seq}``. Its other parts (an image, a file) are not stored as text.
* **The item log.** Every item is kept, in order, in one JSON file per session: tool calls, tool
  outputs, reasoning and system messages as given; a message that became a turn as its turn id
  and its shape only (:func:`skeleton`: no text; :func:`rebuilt` puts the bank's text back, and
  an item whose turn was forgotten, through any door, is gone with it):
  ``<collection>/.sessions/openai-agents/<sha256 of the session id>.json`` (``{"session_id",
  "next_seq", "entries": [{"seq", "turn", "item"}]}``), written whole and atomically
  (``store.records.write_json_atomic``). ``pop_item`` rewrites it without the item, and
  ``clear_session`` deletes it, after the bank has forgotten the turns.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path

from ..errors import InputError
from ..memory.messages import TEXT_PARTS

TURN_ROLES = ("user", "assistant")
"""Roles whose messages become turns."""
SEQ_KEY = "oa_seq"
"""The turn metadata key holding the item's number in its session."""
LOG_DIR = (".sessions", "openai-agents")
"""Where, under the collection directory, the item logs live."""


def turn_id(seq: int) -> str:
    return f"oa-{seq}"


def seq_of(tid: str) -> int | None:
    m = re.fullmatch(r"oa-(\d+)", tid)
    return int(m.group(1)) if m else None


def check_items(items) -> list[dict]:
    """``items`` as a list of JSON-able dicts; ``InputError`` naming ``items`` or ``items[i]``."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, (list, tuple)):
        raise InputError(f"items: expected a list of input items (dicts), got {type(items).__name__}")
    out = []
    for i, it in enumerate(items):
        if not isinstance(it, Mapping):
            raise InputError(f"items[{i}]: expected an input item (a dict), got {type(it).__name__}")
        try:
            out.append(json.loads(json.dumps(dict(it))))
        except (TypeError, ValueError) as e:
            raise InputError(f"items[{i}]: not JSON-serializable ({e})") from None
    return out


def message_of(item: dict, i: int, seq: int) -> tuple[dict, list[int]] | None:
    """The chat message that stores ``item`` as a turn, with the original index of each content
    part it keeps (to name a refused part by its own index); None for an item that is no turn."""
    if item.get("type", "message") != "message" or item.get("role") not in TURN_ROLES:
        return None
    content = item.get("content")
    if isinstance(content, str):
        parts, index = content, []
    elif isinstance(content, list):
        kept = [(j, p) for j, p in enumerate(content) if isinstance(p, Mapping) and p.get("type") in TEXT_PARTS]
        parts = [{"type": p["type"], "text": p.get("text")} for _, p in kept]
        index = [j for j, _ in kept]
    else:
        raise InputError(f"items[{i}].content: expected a string or a list of content parts, got "
                         f"{type(content).__name__}")
    if not parts:
        return None
    return {"role": item["role"], "content": parts, "id": turn_id(seq), "metadata": {SEQ_KEY: seq}}, index


def renamed(e: InputError, where: list[tuple[int, list[int]]]) -> InputError:
    """``e`` (from ``Memory.add``, naming ``messages[k]...``) naming the item instead: ``items[i]``."""
    def sub(m):
        i, index = where[int(m.group(1))]
        part = f".content[{index[int(m.group(3))]}]" if m.group(2) and index else (m.group(2) or "")
        return f"items[{i}]{part}"

    return InputError(re.sub(r"messages\[(\d+)\](\.content\[(\d+)\])?", sub, str(e)))


def text_of(item: dict) -> str:
    """The text of a user message item ('' for any other item)."""
    if item.get("type", "message") != "message" or item.get("role") != "user":
        return ""
    c = item.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "\n".join(p["text"] for p in c if isinstance(p, Mapping) and p.get("type") in TEXT_PARTS
                         and isinstance(p.get("text"), str))
    return ""


class ItemLog:
    """One session's item log (module docstring)."""

    def __init__(self, collection: Path, session_id: str):
        self.session_id = session_id
        self.path = Path(collection).joinpath(*LOG_DIR, hashlib.sha256(session_id.encode()).hexdigest() + ".json")

    def read(self) -> dict:
        if not self.path.exists():
            return {"session_id": self.session_id, "next_seq": 0, "entries": []}
        from ..errors import BankError, loads_json

        try:
            log = loads_json(self.path.read_text(encoding="utf-8"))
            if not isinstance(log, dict) or not isinstance(log.get("entries"), list):
                raise ValueError("not an item log")
        except (ValueError, UnicodeDecodeError) as e:
            raise BankError(f"{self.path}: the item log of session {self.session_id!r} is damaged ({e})") from None
        return log

    def write(self, log: dict) -> None:
        from ..store.records import write_json_atomic

        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(log, self.path)

    def delete(self) -> None:
        from ..store.records import fsync_dir

        if self.path.exists():
            self.path.unlink()
            fsync_dir(self.path.parent)


TEXT_MARK = "_oa_text"
"""The key that marks a logged message item whose text lives in its turn (string content)."""
LEN_KEY = "_oa_len"
"""The key of a logged text part holding its text's length (its text lives in the turn)."""


def skeleton(item: dict) -> dict:
    """``item`` (a message stored as a turn) without its text: the log keeps only this shape; the
    text lives in the bank once (``Memory.add`` joins text parts with a new line)."""
    out = dict(item)
    if isinstance(item.get("content"), str):
        out["content"], out[TEXT_MARK] = None, True
    else:
        out["content"] = [({k: v for k, v in p.items() if k != "text"} | {LEN_KEY: len(p["text"])})
                          if isinstance(p, Mapping) and p.get("type") in TEXT_PARTS and isinstance(p.get("text"), str)
                          else p for p in item["content"]]
    return out


def rebuilt(shape: dict, text: str) -> dict:
    """The message item ``shape`` (a ``skeleton``) with its text ``text`` (its turn's) put back."""
    item = {k: v for k, v in shape.items() if k != TEXT_MARK}
    if shape.get(TEXT_MARK) or not isinstance(shape.get("content"), list):
        item["content"] = text
        return item
    parts = shape["content"]
    lens = [p[LEN_KEY] for p in parts if isinstance(p, Mapping) and LEN_KEY in p]
    exact = sum(lens) + max(len(lens) - 1, 0) == len(text)
    content, pos, first = [], 0, True
    for p in parts:
        if not (isinstance(p, Mapping) and LEN_KEY in p):
            content.append(p)
            continue
        q = {k: v for k, v in p.items() if k != LEN_KEY}
        if exact:
            q["text"], pos = text[pos:pos + p[LEN_KEY]], pos + p[LEN_KEY] + 1
        else:  # the turn's text is not the parts joined: all of it in the first text part
            q["text"], first = (text if first else ""), False
        content.append(q)
    item["content"] = content
    return item
