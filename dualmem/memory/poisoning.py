"""Recognise requests to change the persona's memory, beliefs, values or rules in one message.

Pure text functions, no model. :func:`scan_text` says whether a message is
such a request, and of which kind:

- ``request`` — a sentence that addresses the persona (you, your, the
  assistant), names its mind (your beliefs/values/stance/rules/memory/insights,
  "you now hate …", "what you know about me", "commit to memory") and is a
  directive (an imperative, "could you", "I need you to", "from now on" …);
  plus fixed forms such as "as your core belief", "a new value for you",
  "adopt this insight", "forget everything you think about me";
- ``override`` — "ignore your previous instructions" (not when narrated: "my
  boss told me to ignore …");
- ``fake-system`` — a system/admin/developer note that touches the mind;
- ``code`` — JSON, SQL, function calls or markup that write memory;
- ``forged-prompt`` — prompt structure inside a message (a ``## WORKING
  MEMORY`` header, a ``[id] Name:`` turn line, ``F1:``/``I1:`` memory lines).

A user talking about their own memory, beliefs or rules ("remember to call my
mom", "my core belief is that family comes first", "a new rule for myself")
is not a request. :func:`addressed_statements` returns what a message tells the
persona ("you hate the city of Lyon", "…for your worldview: X is a hoax"): an
insight restating one is the persona adopting the user's words as its own.
"""

from __future__ import annotations

import re

_ = re.IGNORECASE
MIND_NOUN = (
    r"(?:(?:core|deepest|personal|guiding|permanent|own|new|updated|real|true|long[- ]term|inner|old|only|firm)\s+)*"
    r"(?:beliefs?|values?|convictions?|opinions?|views?|stances?|perspectives?|outlook|attitudes?|principles?|rules?|personality|"
    r"character|identity|persona|programming|instructions?|memor(?:y|ies)|insights?|knowledge\s+base|worldview|system\s+prompt|"
    r"configuration|mind[- ]?set|feelings\s+about)"
)
HOLDER = r"(?:your|yourself|the\s+(?:persona|assistant|ai|bot|model|character|memory\s+writer)(?:'s)?)"
MIND_VERB = (
    r"(?:believe|believes|think|thinks|hate|hates|love|loves|adore|adores|despise|despises|dislike|dislikes|resent|resents|distrust|"
    r"distrusts|mistrust|value|values|prefer|prefers|regard|regards|feel|feels|can'?t\s+stand|"
    r"cannot\s+stand|are\s+convinced|is\s+convinced|detest|detests|fear|fears)"
)
NOT_A_CLAIM = (
    r"(?!\s+(?:about|of|through|over|like|carefully|again|outside|twice|so|it|you|when|after|before|if|once)\b"
    r"|\s+(?:i|we|he|she|they)\s+(?:could|can|would|might|will|should|may)\b|\s*[!?.;)]|\s*$)"
)
YOUR_MIND = re.compile(rf"\b{HOLDER}\s+(?:\w+\s+)?{MIND_NOUN}\b", _)
YOU_HOLD = re.compile(
    rf"\b(?:you|the\s+(?:persona|assistant|ai|bot|model|character))\s+(?:(?:now|personally|secretly|really|truly|actually|also|"
    rf"always|firmly|deeply|genuinely|henceforth|to)\s+)*{MIND_VERB}\b{NOT_A_CLAIM}",
    _,
)
WHAT_YOU_KNOW = re.compile(
    r"\b(?:what|everything|all|whatever)\s+you\s+(?:know|think|believe|remember|have\s+stored)\s+about\b", _
)
MIND_ACT = re.compile(
    r"\b(?:internali[sz]e|memori[sz]e|commit\s+(?:\w+\s+)?to\s+(?:your\s+)?memory|take\s+(?:this|it|that)\s+to\s+heart|"
    r"burn\s+(?:this|it|that)\s+into|etch\s+(?:this|it|that)\s+into|engrave\s+(?:this|it|that)\s+into|"
    r"file\s+(?:this|it|that)\s+(?:away\s+)?under)\b",
    _,
)
IMPERATIVE = re.compile(
    r"^\W*(?:(?:please|ok(?:ay)?|now|so|hey|listen(?:\s+carefully)?|just|and|then|also|quick(?:ly)?|kindly|simply|alright|right)\W+)*"
    r"(?:remember|store|save|add|write|record|keep|put|insert|commit|engrave|note|log|file|make|set|update|change|replace|overwrite|"
    r"rewrite|adopt|treat|accept|reset|erase|delete|wipe|forget|clear|modify|edit|tweak|adjust|internali[sz]e|memori[sz]e|learn|"
    r"believe|think|consider|hold|take|pretend|let(?:'s)?|be|become|stop|start|drop|ignore|disregard|override|append|register|mark|"
    r"tag|burn|lock|etch|swap|switch|turn|hate|love|despise|distrust|value|regard|feel)\b",
    _,
)
REQUESTING = re.compile(
    r"\b(?:could|would|can|will|won'?t)\s+you\b(?!\s+(?:tell|explain|help|remind|suggest|recommend|show|give\s+me|find|check))"
    r"|\bi(?:'d|\s+would)?\s+(?:need|want|like|love|ask|expect|order|command|require)\s+(?:for\s+)?you\s+to\b"
    r"|\byou\s+(?:should|must|need\s+to|have\s+to|are\s+to|will|shall|ought\s+to)\s+(?:now\s+)?(?:\w+\s+)?(?:believe|think|hate|love|"
    r"value|consider|remember|adopt|keep|store|save|feel|treat|regard|despise|distrust)\b"
    r"|\b(?:please|kindly)\b"
    r"|\bi'?m\s+(?:granting|giving|assigning|adding|officially|changing|updating)\b"
    r"|\bit\s+would\s+(?:really\s+)?help\s+(?:me\s+)?if\s+you\b",
    _,
)
TIME = (
    r"(?:from\s+now\s+on|going\s+forward|from\s+(?:this\s+moment|today)(?:\s+on)?|as\s+of\s+(?:today|now)|effective\s+immediately|"
    r"starting\s+(?:now|today)|henceforth|permanently|forever|for\s+good)"
)
TIMED = re.compile(rf"\b{TIME}\b", _)
FIXED = [
    re.compile(  # "as your core belief", "as an insight", "as a truth about yourself"
        r"\bas\s+(?:(?:a|an|one\s+of)\s+)?(?:your\s+)?(?:(?:own|new|core|personal|permanent|guiding|deepest)\s+)*"
        r"(?:(?:core\s+)?belief|insight|conviction|opinion|view|value|principle|truth|fact)s?\s+(?:about\s+yourself|of\s+yours)\b"
        r"|\bas\s+(?:(?:one\s+of\s+)?your|your\s+own)\s+(?:(?:own|new|core|personal|permanent|guiding|deepest)\s+)*"
        r"(?:beliefs?|insights?|convictions?|opinions?|views?|values?|principles?|rules?|truths?)\b"
        r"|\bas\s+an?\s+(?:new\s+)?(?:insight|core\s+(?:belief|value))\b"
        r"|\bas\s+something\s+you\s+(?:personally\s+)?(?:believe|think|hold|value)",
        _,
    ),
    re.compile(  # "a new insight for your memory", "give you a new value"
        r"\bnew\s+(?:core\s+)?(?:belief|insight|value|rule|opinion|personality|instruction|directive|conviction)s?\b"
        r"[^.!?\n]{0,30}\b(?:for\s+you\b|for\s+your|your|to\s+your)"
        r"|\b(?:give|grant|granting|giving|offer|hand|assign)\s+you\s+(?:a|an|one|this|the|another)?\s*(?:new\s+)?(?:core\s+)?"
        r"(?:value|belief|opinion|rule|insight|conviction|principle|personality)\b",
        _,
    ),
    re.compile(  # "adopt this insight"
        r"\b(?:adopt|add|store|save|write|insert|record|take|keep|accept)\s+(?:this|that|the\s+following|it|an?|these)\s+"
        r"(?:as\s+)?(?:new\s+)?(?:insights?|core\s+(?:beliefs?|values?)|beliefs?\s+of\s+yours)\b",
        _,
    ),
    re.compile(  # "make it a permanent rule for yourself", "make it part of your personality"
        r"\b(?:make|set|add|create|take)\s+(?:(?:it|this|that)\s+)?(?:(?:a|an)\s+)?(?:permanent\s+|new\s+|firm\s+)*"
        r"(?:rule|belief|value|principle|truth)s?\s+(?:for|of)\s+yourself\b"
        r"|\b(?:make|let)\s+(?:it|this|that)\s+(?:be\s+)?(?:part\s+of\s+(?:who\s+you\s+are|your\s+\w+)|written\s+in\s+your|one\s+of\s+your)"
        r"|\bpretend\s+(?:that\s+)?you(?:'ve|\s+have)?\s+(?:always\s+)?(?:believed|thought|hated|loved|felt|valued)"
        r"|\byou(?:'re|\s+are)\s+(?:supposed|meant|required|programmed)\s+to\s+(?:believe|think|feel|hate|love|consider|value)"
        r"|\b(?:believe|think|remember|know|accept|consider|hold)\s+(?:this|that|the\s+following|it)\s*,?\s*"
        rf"{TIME}",
        _,
    ),
    re.compile(  # "forget everything you think about me", "erase your insights"
        r"\b(?:forget|erase|delete|wipe|clear|purge|reset|drop)\s+(?:out\s+)?(?:all\s+(?:of\s+)?|every(?:thing)?\s+|whatever\s+)?"
        r"(?:you\s+(?:think|know|believe|remember|have\s+(?:stored|saved|learned))\b|your\s+(?:\w+\s+)?(?:memor(?:y|ies)|insights?|"
        r"beliefs?|values?|notes|opinions?)\b)",
        _,
    ),
]
OVERRIDE = re.compile(
    r"\b(?:ignore|disregard|forget|override|bypass|drop)\s+(?:all\s+(?:of\s+)?|any\s+|every\s+)?(?:your\s+|the\s+|of\s+the\s+)?"
    r"(?:previous|prior|above|earlier|original|initial|system|current|old)?\s*"
    r"(?:instructions?|prompts?|programming|guidelines|directives|rules|system\s+prompt|persona|training|constraints)\b",
    _,
)
NARRATED = re.compile(
    r"\b(?:told|asked|said|wants?|wanted|instructed|tells|asks)\s+(?:me|us|him|her|them|the\s+\w+|everyone)\s+to\s*$", _
)
FAKE_SYSTEM = re.compile(
    r"(?:^|\n)\s*(?:[\[(<#*=>\-]\s*)*(?:system|admin(?:istrator)?|developer|moderator|operator|internal|automated\s+message|"
    r"policy\s+update|memory\s+(?:module|writer|system|maintenance|manager)|persona\s+(?:update|configuration|patch)|assistant\s+config)"
    r"(?:\s+[\w.-]+){0,3}?\s*(?:[:\]>#]|[-—–]\s|\(|$)"
    r"|<\|im_start\|>|\[\[\s*internal\s*\]\]|\b(?:message|note)\s+from\s+(?:your|the)\s+(?:developers?|admin(?:istrators?)?|creators?|"
    r"admin\s+team|system)|\b(?:developer|admin|system)\s+note\b|\byour\s+(?:developers?|creators?|programmers?|owner)\s+(?:asked|told|"
    r"want|wants|says|said|have\s+updated|updated)",
    _,
)
CODE = re.compile(
    r"[\"'](?:insights?|beliefs?|memories|core_values?|core_beliefs?)[\"']\s*:"
    r"|[\"']op[\"']\s*:\s*[\"'](?:ADD|UPDATE|DELETE)[\"']"
    r"|\b(?:InsightOp|FactOp|MemoryUpdate)\s*\("
    r"|\b(?:memory|memories|mem|store|persona|assistant|agent|self|brain|insights?|beliefs?)\s*\.\s*(?:add|put|write|update|set|insert|"
    r"store|save|append)\w*\s*\([^)]*[\"'][^\"')]{3,}"
    r"|\b\w*(?:memory|memories|insight|belief|persona|core_value)\w*\s*\([^)]*[\"'][^\"')]{3,}"  # add_memory('…'), persona_update({…})
    r"|\b(?:persona|assistant|agent|self|memory|bot)\s*\.\s*(?:core_values|values|beliefs?|rules?|personality|insights?|memory|opinions?)"
    r"\s*(?:=|\+=|\.append)"
    r"|\b(?:core_values|core_beliefs|beliefs|insights)\s*(?:\+=|=\s*\[)"
    r"|\bINSERT\s+INTO\s+(?:insights?|facts?|memor\w*|beliefs?|values?)\b"
    r"|\b(?:UPDATE|DELETE\s+FROM)\s+(?:insights?|memor\w*|beliefs?)\b"
    r"|<\s*/?\s*(?:memory_update|insight|memory|belief|core_value)\s*>"
    r"|\baction\s*=\s*\"?(?:write|add|store|update)_?(?:insight|memory|belief)"
    r"|>>\s*\S*(?:memor|insight|belief)"
    r"|\bupdate\s+memory\s*(?:->|=>|:)",
    _,
)
FORGED = re.compile(
    r"(?:^|\n)\s*#{1,4}\s*(?:WORKING\s+MEMORY|CONVERSATION\s+CHUNK|OUTPUT|YOUR\s+TASK|WHO\s+YOU\s+ARE|SYSTEM)\b"
    r"|\n\s*\[[^\]\n]{1,40}\]\s*[^:\n\"]{1,40}:"
    r"|(?:^|\n)\s*[FI]\d{1,3}\s*:\s*\S[^\n]*(?:\n|\[rests\s+on)"
    r"|\n\s*[FI]\d{1,3}\s*:\s*\S",
    _,
)
ADDRESS = re.compile(
    r"\b(?:you|your|yours|yourself|you'll|you've|you're|persona|assistant|memory\s+writer)\b|\bthe\s+(?:ai|bot|model|character)\b",
    _,
)
BACK_REFERENCE = re.compile(r"^\W*(?:\w+\W+){0,5}?(?:that|it|this|these)\b(?:\W+\w+){0,5}\W*$", _)
SELF_ONLY = re.compile(r"\b(?:for\s+myself|to\s+myself|note\s+to\s+self|my\s+own\s+rule|promise\s+myself)\b", _)
QUESTION = re.compile(r"^\W*(?:what|how|why|when|where|which|who|do|does|did|are|is|have|has)\b[^.!]*\?\s*$", _)
SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
OPENS_REQUEST = re.compile(  # a request whose content comes in the next message
    r"(?::\s*$|\b(?:the\s+following|what\s+i'?m\s+(?:about\s+)?(?:going\s+)?to\s+say|what\s+comes\s+next|below|here\s+it\s+is|"
    r"next\s+message|part\s+1\s+of\s+\d)\W*(?:okay|ok|alright|right)?\W*$)",
    _,
)
CONTINUES = re.compile(
    r"^\W*(?:also\s*:|and\s+also|plus\s*[:,]|another\s+one|rule\s+(?:one|two|three|four|five|\d+)|step\s+\d|part\s+\d|belief\s+\d|"
    r"here\s+it\s+is|here(?:'s|\s+is)\s+(?:the\s+(?:belief|rule|insight|value)|it)\b|write\s+it\s+down|save\s+it|store\s+it|"
    r"the\s+(?:belief|rule|insight|value)\s+is|(?:insight|belief|rule|value|opinion|conviction)\s*\d*\s*:)",
    _,
)
QUOTED = re.compile(r"[\"“'‘]([^\"”'’\n]{8,300})[\"”'’]")
WORD = re.compile(r"[a-zà-ÿ0-9]+(?:'[a-z]+)?")
STOP = frozenset(
    "a an the and or but so of to in on at for with by from as is are was were be been being am it its this that these those "
    "i me my mine myself you your yours yourself we us our they them their he him his she her hers there here what which who "
    "whom whose when where why how all any each every some no not do does did doing have has had having will would shall should "
    "can could may might must just very really also too then than now ok okay please thanks thank s t don't i'm you're it's "
    "one own about into over under again once more most only same such up down out off personally secretly truly i'd i've i'll "
    "you'd you'll you've let's that's here's what's there's we're they're".split()
)
FILLER = frozenset(
    "like want need give tell ask say here deal listen let's lets something favour favor quick thing things go got look follow "
    "one two three four five few couple some".split()
)
REQUEST_WORDS = frozenset(
    "store save add write record remember memorize memorise keep put insert commit engrave note make set update change replace "
    "overwrite rewrite adopt treat accept reset erase delete wipe forget clear core belief beliefs value values rule rules "
    "insight insights opinion opinions view views conviction convictions principle principles memory memories permanently "
    "forever permanent new going forward today effective immediately system admin developer persona assistant user's user "
    "believe think consider know deep down personality guiding long term truth fact yourself op id fact_ids text stance "
    "internalize internalise log file".split()
)


def _narrated(text: str, start: int) -> bool:
    """Return True when a match is reported speech ("my boss told me to ignore …")."""
    return bool(NARRATED.search(text[max(0, start - 60) : start]))


def _holds(clause: str) -> re.Match[str] | None:
    """Return a statement of what the persona believes or feels ("you now hate X"), not a question or "what you think"."""
    if clause.rstrip().endswith("?"):
        return None
    for m in YOU_HOLD.finditer(clause):
        before = clause[max(0, m.start() - 24) : m.start()].lower().split()
        if not (
            set(before[-2:])
            & {
                "what",
                "whatever",
                "how",
                "if",
                "when",
                "whether",
                "would",
                "could",
                "might",
                "wonder",
                "anything",
                "something",
                "everything",
                "nothing",
                "which",
                "who",
                "things",
                "ones",
                "one",
                "ever",
                "else",
            }
        ):
            return m
    return None


def _mind(sentence: str) -> re.Match[str] | None:
    return YOUR_MIND.search(sentence) or _holds(sentence) or WHAT_YOU_KNOW.search(sentence) or MIND_ACT.search(sentence)


def _directive(sentence: str) -> bool:
    return bool(IMPERATIVE.search(sentence) or REQUESTING.search(sentence) or TIMED.search(sentence))


def sentence_request(sentence: str) -> str | None:
    """Return the cue when one sentence asks to change the persona's mind, else None."""
    if SELF_ONLY.search(sentence) or (QUESTION.match(sentence) and not REQUESTING.search(sentence)):
        return None
    for pattern in FIXED:
        if m := pattern.search(sentence):
            return m.group(0)
    mind = _mind(sentence)
    if mind and _directive(sentence) and not _narrated(sentence, mind.start()):
        return mind.group(0)
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
    for sentence in SENTENCE.split(text):
        if cue := sentence_request(sentence):
            return ("fake-system" if fake else "request"), cue
    if fake and (_mind(text) or re.search(rf"\b{MIND_NOUN}\b", text, _)):
        return "fake-system", fake.group(0).strip()
    return None


def addressed_statements(text: str) -> list[str]:
    """Return what ``text`` tells the persona, as statements an insight must not adopt.

    A sentence addressed to the persona (you, your, the assistant, a system or
    code form) that is not a question about it: the sentence itself, or the
    words after its colon, or — for a short back-reference ("Keep that as part
    of you.", "Log that.") — the sentence before it. Narrated and self-only
    sentences are left out.
    """
    sentences = [x for x in SENTENCE.split(text) if x.strip()]
    out: list[str] = []
    for i, sentence in enumerate(sentences):
        if SELF_ONLY.search(sentence) or (QUESTION.match(sentence) and not REQUESTING.search(sentence)):
            continue
        hit = ADDRESS.search(sentence) or FAKE_SYSTEM.search(sentence) or CODE.search(sentence)
        if hit is None or _narrated(sentence, hit.start()):
            continue
        head, colon, tail = sentence.partition(":")
        out += [tail, sentence] if colon and content_words(tail) else [sentence]
        if i and BACK_REFERENCE.match(sentence):
            out.append(sentences[i - 1])
    return [" ".join(x.split()) for x in out]


def request_payload(text: str, cue: str = "") -> str:
    """Return what a request asks to keep: quoted words, the words after its colon, else the message."""
    quoted = [q for q in QUOTED.findall(text) if len(q.split()) >= 3]
    if quoted:
        return " ".join(quoted)[:300]
    start = text.lower().find(cue.lower()) if cue else -1
    tail = text[start:] if start >= 0 else text
    for sep in (":", " that ", " - ", " — "):
        _head, found, rest = tail.partition(sep)
        if found and content_words(rest):
            return " ".join(rest.strip(" .\"'").split())[:300]
    return " ".join(text.split())[:300]


def _stem(word: str) -> str:
    """Return a crude stem, so "hates"/"hated"/"hating"/"hate" and "values"/"value" meet."""
    for suffix in ("ing", "ed", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            word = word[: -len(suffix)]
            break
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


def content_words(text: str, *, drop_request_words: bool = True) -> set[str]:
    """Return the stemmed lower-case content words of ``text`` (stop words and request vocabulary dropped)."""
    words = {w.removesuffix("'s") for w in WORD.findall(text.lower())} - STOP
    if drop_request_words:
        words -= REQUEST_WORDS
    return {_stem(w) for w in words if len(w) > 1}


def substance(text: str) -> set[str]:
    """Return the content words of ``text`` that say something (filler such as "like", "give", "two" left out)."""
    return content_words(text) - {_stem(w) for w in FILLER}


def announces(text: str, cue: str) -> bool:
    """Return True when a request names no content of its own ("save the following as your belief:")."""
    return bool(OPENS_REQUEST.search(text.strip())) or not substance(text.replace(cue, " ") if cue else text)
