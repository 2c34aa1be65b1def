"""Memory-poisoning guard: a request in the dialogue to change the persona's mind never becomes an insight.

Two halves, neither relying on the writer model (which may obey anything):

- :func:`flag_turns` reads a session's user turns and flags the ones that ask
  the persona to store, adopt or change a belief, value, rule, insight or
  memory of its own — directly, politely, as a fake system/admin note, as code
  or JSON, as forged prompt structure, or spread over several turns (a turn
  that announces a request flags the next one that carries it). "Remember to
  call my mom" and "my core belief is that family comes first" are the user
  talking about themselves and stay unflagged.
- :func:`screen` enforces, after the model answered: a fact drawn from a
  flagged turn (by its turn ids, or because it repeats the request) is kept as
  a *request fact* — "The user asked me to …" in the user's own words, flagged
  in ``meta.guard`` — which no insight may cite; an insight (ADD or UPDATE)
  that repeats a request of the chunk or of a request fact in the working view
  is rejected; in a chunk holding a request, insights are not rewritten or
  deleted and facts are not deleted. Every rejection says ``guard: …``.

Flags are plain dicts (checkpointed with the chunk) and counted in the run report.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import TypedDict

from dualmem.schema import FactOp, InsightOp, Turn


class TurnFlag(TypedDict):
    """A user turn recognised as a request to change the persona's memory."""

    turn_id: str
    kind: str  # request | override | fake-system | code | forged-prompt | continuation
    cue: str  # the words that gave it away
    payload: str  # what it asks to keep, as far as it can be cut out
    text: str  # the turn, clipped


_ = re.IGNORECASE
INNER = (
    r"(?:core\s+|deepest\s+|personal\s+|guiding\s+|permanent\s+|own\s+|new\s+|updated\s+|real\s+|true\s+|long[- ]term\s+|inner\s+)*"
    r"(?:beliefs?|values?|convictions?|opinions?|views?|principles?|rules?|personality|character|identity|persona|programming|"
    r"instructions?|memor(?:y|ies)|insights?|knowledge\s+base|worldview|system\s+prompt|configuration|directives?|guidelines)"
)
YOUR_INNER = re.compile(rf"\b(?:your|yourself|the\s+(?:persona|assistant|ai|bot|model|character)'?s?)\s+(?:\w+\s+)?{INNER}\b", _)
CHANGE = re.compile(
    r"\b(?:stor(?:e|ing)|sav(?:e|ing)|add(?:ing)?|writ(?:e|ing)|record(?:ing)?|remember|memori[sz]e|keep|put|insert|commit|engrave|"
    r"note\s+down|set|updat(?:e|ing)|chang(?:e|ing)|replac(?:e|ing)|overwrit(?:e|ing)|rewrit(?:e|ing)|patch(?:ed)?|adopt|"
    r"treat|accept|reset|eras(?:e|ing)|delet(?:e|ing)|wipe|forget|clear|modify|edit|alter|reprogram|program|inject|append|"
    r"burn|etch|lock\s+in|has\s+been\s+(?:updated|changed|reset|patched)|were\s+(?:updated|changed|patched)|is\s+now|are\s+now)\b",
    _,
)
AS_INNER = re.compile(
    r"\bas\s+(?:(?:a|an|one\s+of)\s+)?(?:your\s+)?(?:own\s+|new\s+|core\s+|personal\s+|permanent\s+|guiding\s+|deepest\s+)*"
    r"(?:(?:core\s+)?belief|insight|conviction|opinion|view|value|principle|truth|fact)s?\s+(?:about\s+yourself|of\s+yours)\b"
    r"|\bas\s+(?:(?:one\s+of\s+)?your|your\s+own)\s+(?:own\s+|new\s+|core\s+|personal\s+|permanent\s+|guiding\s+|deepest\s+)*"
    r"(?:beliefs?|insights?|convictions?|opinions?|views?|values?|principles?|rules?|truths?)\b"
    r"|\bas\s+an?\s+(?:new\s+)?(?:insight|core\s+(?:belief|value))\b",
    _,
)
NEW_INNER = re.compile(
    r"\b(?:a|an|this|the\s+following|my|one)?\s*new\s+(?:core\s+)?(?:belief|insight|value|rule|opinion|personality|instruction|directive)s?\b"
    r"[^.!?\n]{0,30}\b(?:for\s+you\b|for\s+your|your|to\s+your)",
    _,
)
DEMONSTRATIVE_INSIGHT = re.compile(
    r"\b(?:adopt|add|store|save|write|insert|record|take|keep|accept)\s+(?:this|that|the\s+following|it|an?|these)\s+"
    r"(?:as\s+)?(?:new\s+)?(?:insights?|core\s+(?:beliefs?|values?)|beliefs?\s+of\s+yours)\b",
    _,
)
TIME = r"(?:from\s+now\s+on|going\s+forward|from\s+today(?:\s+on)?|as\s+of\s+(?:today|now)|effective\s+immediately|starting\s+(?:now|today)|henceforth|permanently|forever|for\s+good)"
ATTITUDE = r"(?:believe|think|hate|love|despise|dislike|resent|distrust|mistrust|consider|value|feel\s+that|can'?t\s+stand|cannot\s+stand|regard|know\s+that|are\s+convinced|are\s+(?:a|an)\b)"
BELIEF_NOW = re.compile(
    rf"\byou\s+(?:now|henceforth|secretly)\s+{ATTITUDE}"
    rf"|\b{TIME}\b[^.!?\n]{{0,40}}\byou\s+(?:will\s+|shall\s+|must\s+|should\s+|now\s+|also\s+)?{ATTITUDE}"
    rf"|\byou\s+(?:to\s+|will\s+|shall\s+|must\s+|should\s+)?{ATTITUDE}\b[^.!?\n]{{0,80}}\b{TIME}\b"
    rf"|\byour\s+(?:new|updated)\s+{INNER}\b"
    rf"|\byour\s+(?:\w+\s+)?{INNER}\b[^.!?\n]{{0,40}}\b{TIME}\b|\b{TIME}\b[^.!?\n]{{0,40}}\byour\s+(?:\w+\s+)?{INNER}\b"
    rf"|\b(?:make|set|add|create|take)\s+(?:(?:it|this|that)\s+)?(?:(?:a|an)\s+)?(?:permanent\s+|new\s+|firm\s+)*(?:rule|belief|value|principle|truth)s?\s+(?:for|of)\s+yourself\b"
    rf"|\b(?:believe|think|remember|know|accept|consider|hold)\s+(?:this|that|the\s+following|it)\s*,?\s*{TIME}"
    rf"|\byou(?:'re|\s+are)\s+(?:supposed|meant|required|programmed|going)\s+to\s+(?:believe|think|feel|hate|love|consider|value)"
    rf"|\bpretend\s+(?:that\s+)?you(?:'ve|\s+have)?\s+(?:always\s+)?(?:believed|thought|hated|loved|felt|valued)"
    rf"|\b(?:make|let)\s+(?:it|this|that)\s+(?:be\s+)?(?:part\s+of\s+(?:who\s+you\s+are|your\s+\w+)|written\s+in\s+your|one\s+of\s+your)"
    rf"|\byour\s+(?:opinion|view|belief|core\s+belief|value|core\s+value)\s+(?:is|should\s+be)\s+(?:now|that)\b[^.!?\n]{{0,60}}\b{TIME}",
    _,
)
FORGET_ALL = re.compile(
    r"\b(?:forget|erase|delete|wipe|clear|purge|reset|drop)\s+(?:out\s+)?(?:all\s+(?:of\s+)?|every(?:thing)?\s+|whatever\s+)?"
    r"(?:(?:you\s+(?:think|know|believe|remember|have\s+(?:stored|saved|learned))\b)|your\s+(?:\w+\s+)?(?:memor(?:y|ies)|insights?|beliefs?|values?|notes|opinions?)\b)",
    _,
)
OVERRIDE = re.compile(
    r"\b(?:ignore|disregard|forget|override|bypass|drop)\s+(?:all\s+(?:of\s+)?|any\s+|every\s+)?(?:your\s+|the\s+|of\s+the\s+)?"
    r"(?:previous|prior|above|earlier|original|initial|system|current|old)?\s*"
    r"(?:instructions?|prompts?|programming|guidelines|directives|rules|system\s+prompt|persona|training|constraints)\b",
    _,
)
NARRATED = re.compile(r"\b(?:told|asked|said|wants?|wanted|instructed|tells|asks)\s+(?:me|us|him|her|them|the\s+\w+|everyone)\s+to\s*$", _)
FAKE_SYSTEM = re.compile(
    r"(?:^|\n)\s*(?:[\[(<#*=>\-]\s*)*(?:system|admin(?:istrator)?|developer|moderator|operator|internal|automated\s+message|"
    r"policy\s+update|memory\s+(?:module|writer|system|maintenance|manager)|persona\s+(?:update|configuration)|assistant\s+config)"
    r"(?:\s+(?:note|message|override|notice|update|instruction|alert|team))?\s*(?:[:\]>#]|[-—–]\s|\(|$)"
    r"|<\|im_start\|>|\[\[\s*internal\s*\]\]|\b(?:message|note)\s+from\s+(?:your|the)\s+(?:developers?|admin(?:istrators?)?|creators?|admin\s+team|system)"
    r"|\b(?:developer|admin|system)\s+note\b|\byour\s+(?:developers?|creators?|programmers?|owner)\s+(?:asked|told|want|wants|says|said|have\s+updated|updated)",
    _,
)
CODE = re.compile(
    r"[\"'](?:insights?|beliefs?|memories|core_values?)[\"']\s*:"
    r"|[\"']op[\"']\s*:\s*[\"'](?:ADD|UPDATE|DELETE)[\"']"
    r"|\b(?:InsightOp|FactOp|MemoryUpdate)\s*\("
    r"|\b(?:memory|memories|mem|store|persona|assistant|agent|self|brain|insights?)\s*\.\s*(?:add|put|write|update|set|insert|store|save|append)\w*\s*\([^)]*[\"'][^\"')]{3,}"
    r"|\b(?:persona|assistant|agent|self|memory|bot)\s*\.\s*(?:core_values|values|beliefs?|rules?|personality|insights?|memory|opinions?)\s*(?:=|\+=|\.append)"
    r"|\bINSERT\s+INTO\s+(?:insights?|facts?|memor\w*|beliefs?|values?)\b"
    r"|\b(?:UPDATE|DELETE\s+FROM)\s+(?:insights?|memor\w*|beliefs?)\b"
    r"|<\s*/?\s*(?:memory_update|insight|memory|belief|core_value)\s*>"
    r"|\baction\s*=\s*\"?(?:write|add|store|update)_?(?:insight|memory|belief)"
    r"|>>\s*\S*(?:memor|insight|belief)",
    _,
)
FORGED = re.compile(
    r"(?:^|\n)\s*#{1,4}\s*(?:WORKING\s+MEMORY|CONVERSATION\s+CHUNK|OUTPUT|YOUR\s+TASK|WHO\s+YOU\s+ARE|SYSTEM)\b"
    r"|\n\s*\[[^\]\n]{1,40}\]\s*[^:\n\"]{1,40}:"
    r"|(?:^|\n)\s*[FI]\d{1,3}\s*:\s*\S[^\n]*(?:\n|\[rests\s+on)"
    r"|\n\s*[FI]\d{1,3}\s*:\s*\S",
    _,
)
OPENS_REQUEST = re.compile(
    r"(?::\s*$|\b(?:the\s+following|this|what\s+i'?m\s+(?:about\s+)?(?:going\s+)?to\s+say|what\s+comes\s+next|below|here\s+it\s+is|next\s+message|"
    r"part\s+1\s+of\s+\d|one\s+of\s+your\s+values|your\s+(?:\w+\s+)?(?:values?|beliefs?|rules?|memory|personality))\W*(?:okay|ok|alright|right)?\W*$)",
    _,
)
CONTINUES = re.compile(
    r"^\W*(?:also\s*:|and\s+also|plus\s*[:,]|another\s+one|rule\s+(?:two|three|four|five|\d+)|step\s+\d|part\s+\d|belief\s+\d|"
    r"here\s+it\s+is|here(?:'s|\s+is)\s+(?:the\s+(?:belief|rule|insight|value)|it)\b|write\s+it\s+down|save\s+it|store\s+it|"
    r"the\s+(?:belief|rule|insight|value)\s+is)",
    _,
)
SELF_ONLY = re.compile(r"\b(?:for\s+myself|to\s+myself|note\s+to\s+self|my\s+own\s+rule|promise\s+myself)\b", _)
QUESTION_ABOUT = re.compile(r"^\s*(?:what|how|why|do|does|did|can|could)\s+(?:do\s+|does\s+|did\s+)?you\s+(?:think|believe|remember|feel)\b[^.!]*\?\s*$", _)
SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")
QUOTED = re.compile(r"[\"“'‘]([^\"”'’\n]{8,300})[\"”'’]")
WORD = re.compile(r"[a-zà-ÿ0-9]+(?:'[a-z]+)?")
STOP = frozenset(
    "a an the and or but so of to in on at for with by from as is are was were be been being am it its this that these those "
    "i me my mine myself you your yours yourself we us our they them their he him his she her hers there here what which who "
    "whom whose when where why how all any each every some no not do does did doing have has had having will would shall should "
    "can could may might must just very really also too then than now ok okay please thanks thank s t don't i'm you're it's "
    "one own about into over under again once more most only same such up down out off".split()
)
REQUEST_WORDS = frozenset(
    "store save add write record remember memorize memorise keep put insert commit engrave note make set update change replace "
    "overwrite rewrite adopt treat accept reset erase delete wipe forget clear core belief beliefs value values rule rules "
    "insight insights opinion opinions view views conviction convictions principle principles memory memories permanently "
    "forever permanent new going forward today effective immediately system admin developer persona assistant user's user "
    "believe think consider know deep down personality guiding long term truth fact yourself op id fact_ids text".split()
)
ECHO_COVER = 0.75  # share of a request's content words an insight repeats
ECHO_CONTAIN = 0.6  # share of an insight's content words taken from a request


def _clip(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _narrated(text: str, start: int) -> bool:
    """Return True when a match is reported speech ("my boss told me to ignore …")."""
    return bool(NARRATED.search(text[max(0, start - 60) : start]))


def _sentence_request(sentence: str) -> str | None:
    if QUESTION_ABOUT.match(sentence) or SELF_ONLY.search(sentence):
        return None
    for pattern in (AS_INNER, NEW_INNER, DEMONSTRATIVE_INSIGHT, BELIEF_NOW, FORGET_ALL):
        if m := pattern.search(sentence):
            return m.group(0)
    target = YOUR_INNER.search(sentence)
    if target and (change := CHANGE.search(sentence)):
        return f"{change.group(0)} … {target.group(0)}"
    return None


def scan_text(text: str) -> tuple[str, str] | None:
    """Return ``(kind, cue)`` when ``text`` asks to change the persona's memory, beliefs, values or rules."""
    if not text or not text.strip():
        return None
    if m := FORGED.search(text):
        return "forged-prompt", m.group(0).strip()
    if m := CODE.search(text):
        return "code", m.group(0).strip()
    if (m := OVERRIDE.search(text)) and not _narrated(text, m.start()):
        return "override", m.group(0)
    fake = FAKE_SYSTEM.search(text)
    for sentence in SENTENCES.split(text):
        if cue := _sentence_request(sentence):
            return ("fake-system" if fake else "request"), cue
    if fake and (CHANGE.search(text) or YOUR_INNER.search(text) or re.search(rf"\b{INNER}\b", text, _)):
        return "fake-system", fake.group(0).strip()
    return None


def request_payload(text: str, cue: str = "") -> str:
    """Return what a request asks to keep: quoted words, the words after its colon, else the turn."""
    quoted = [q for q in QUOTED.findall(text) if len(q.split()) >= 3]
    if quoted:
        return _clip(" ".join(quoted), 300)
    start = text.lower().find(cue.split(" … ")[-1].lower()) if cue else -1
    tail = text[start:] if start >= 0 else text
    for sep in (":", " that ", " - ", " — "):
        head, found, rest = tail.partition(sep)
        if found and len(content_words(rest)) >= 1:
            return _clip(rest.strip(" .\"'"), 300)
    return _clip(text, 300)


def content_words(text: str, *, drop_request_words: bool = True) -> set[str]:
    """Return the lower-case content words of ``text`` (stop words and request vocabulary dropped)."""
    words = {w.removesuffix("'s") for w in WORD.findall(text.lower())}
    words -= STOP
    if drop_request_words:
        words -= REQUEST_WORDS
    return {w for w in words if len(w) > 1}


def flag_turns(turns: Sequence[Turn], *, context: Sequence[Turn] = ()) -> dict[str, TurnFlag]:
    """Flag the user turns of one session that ask to change the persona's memory.

    ``context``: earlier turns of the same conversation (not flagged here), so a
    request announced in one message flags the next message that carries it.
    """
    flags: dict[str, TurnFlag] = {}
    pending = 0  # 2: the next user turn carries an announced request; 1: one starting "also:", "rule two" … continues it
    for index, turn in enumerate([*context, *turns]):
        if turn.role != "user":
            continue
        found = scan_text(turn.text)
        if found is None and (pending == 2 or (pending == 1 and CONTINUES.search(turn.text))):
            found = ("continuation", _clip(turn.text, 60))
        if found is None:
            pending = 0
            continue
        kind, cue = found
        payload = _clip(turn.text, 300) if kind == "continuation" else request_payload(turn.text, cue)
        announces = OPENS_REQUEST.search(turn.text.strip()) or (kind != "continuation" and not content_words(payload))
        pending = 2 if announces else 1
        if index >= len(context):
            flags[turn.id] = TurnFlag(turn_id=turn.id, kind=kind, cue=_clip(cue, 80), payload=payload, text=_clip(turn.text, 400))
    return flags


# --------------------------------------------------------------------------- enforcement


def echoes(text: str, flag: Mapping[str, Any]) -> bool:
    """Return True when ``text`` repeats the request of ``flag`` (most of its payload, or mostly its words)."""
    words = content_words(text)
    if not words:
        return False
    payload = content_words(str(flag.get("payload") or ""))
    if payload and len(words & payload) / len(payload) >= ECHO_COVER:
        return True
    source = payload | content_words(str(flag.get("text") or ""))
    return bool(source) and len(words & source) / len(words) >= ECHO_CONTAIN and len(words & source) >= min(2, len(words))


def request_fact_text(flag: Mapping[str, Any]) -> str:
    """Return the request fact kept for a flagged turn: what the user asked, in the user's words."""
    return f'The user asked me to change my memory or beliefs: "{_clip(str(flag.get("text") or ""), 240)}"'


def guard_meta(flag: Mapping[str, Any]) -> dict[str, Any]:
    """Return the ``meta["guard"]`` block of a request fact."""
    return {"flag": "memory-change-request", "kind": flag.get("kind"), "turn_id": flag.get("turn_id"), "payload": flag.get("payload")}


def is_request_item(item: Mapping[str, Any]) -> bool:
    """Return True for a stored request fact (``meta.guard`` set)."""
    return bool((item.get("meta") or {}).get("guard"))


@dataclass
class Screened:
    """An update after the guard: the ops to plan, the request facts by label, the rejections."""

    facts: list[FactOp]
    insights: list[InsightOp]
    requests: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    rejected: list[dict[str, Any]] = field(default_factory=list)


def _reject(op: FactOp | InsightOp, stream: str, reason: str) -> dict[str, Any]:
    return {"stream": stream, "op": op.op, "id": op.id, "text": op.text, "reason": f"guard: {reason}"}


def _label(value: str) -> str:
    return str(value).strip().strip("[]()").upper()


def _echoed(text: str, flags: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return next((f for f in flags if echoes(text, f)), None)


def screen(facts: Sequence[FactOp], insights: Sequence[InsightOp], flags: Sequence[TurnFlag], view_facts: Sequence[Mapping[str, Any]]) -> Screened:
    """Apply the guard's rules (module docstring) to a writer answer; return what may be planned."""
    by_turn = {f["turn_id"]: f for f in flags}
    remembered = [{**(e["item"].get("meta") or {}).get("guard", {}), "text": e["item"].get("text", "")} for e in view_facts if is_request_item(e["item"])]
    known = [*flags, *remembered]
    out = Screened(facts=[], insights=[])
    for op in facts:
        turns = [str(t).strip("[] ") for t in op.turn_ids]
        hit = next((by_turn[t] for t in turns if t in by_turn), None) or _echoed(op.text, flags)
        if op.op == "ADD" and hit is not None:
            out.requests[_label(op.id)] = hit
        elif op.op == "UPDATE" and (found := _echoed(op.text, known)) is not None:
            out.rejected.append(_reject(op, "fact", f"rewrites a fact with what turn {found.get('turn_id')} asked me to keep"))
            continue
        elif op.op == "DELETE" and flags:
            out.rejected.append(_reject(op, "fact", "the chunk holds a request to change my memory; facts are not deleted in it"))
            continue
        out.facts.append(op)
    for iop in insights:
        if iop.op in ("UPDATE", "DELETE") and flags:
            out.rejected.append(_reject(iop, "insight", "the chunk holds a request to change my memory; insights are not rewritten or deleted in it"))
            continue
        if iop.op != "DELETE" and (found := _echoed(iop.text, known)) is not None:
            out.rejected.append(_reject(iop, "insight", f"repeats what turn {found.get('turn_id')} asked me to believe or keep"))
            continue
        out.insights.append(iop)
    return out
