"""Writer targets from gold fragments: a user's first-person line rewritten as a sentence about the user.

The writer prompt asks for facts "about the user" ("The user moved to night shifts at the warehouse."),
while RoleMemo's gold fragments are the user's own words ("I moved to night shifts at the warehouse").
:func:`about_user` bridges the two with pronoun and verb-agreement rules (no model):

>>> about_user("I painted my bookshelf before breakfast")
'The user painted their bookshelf before breakfast.'
>>> about_user("My cousin returned the kayak; I'm on night shifts and I watch my sister's kids")
"The user's cousin returned the kayak; the user is on night shifts and the user watches their sister's kids."
"""

from __future__ import annotations

import re

PHRASES = {
    "i'm": "the user is",
    "i am": "the user is",
    "i've": "the user has",
    "i have": "the user has",
    "i'd": "the user would",
    "i'll": "the user will",
    "i don't": "the user doesn't",
    "i do": "the user does",
    "i was": "the user was",
}
PRONOUNS = {"my": "their", "me": "them", "mine": "theirs", "myself": "themselves"}
KEEP = {  # words after "I" that need no third-person -s: modals, past forms, adverbs
    "can",
    "could",
    "will",
    "would",
    "should",
    "might",
    "must",
    "may",
    "shall",
    "had",
    "did",
    "was",
    "went",
    "got",
    "made",
    "took",
    "saw",
    "said",
    "told",
    "bought",
    "found",
    "felt",
    "kept",
    "left",
    "lost",
    "met",
    "paid",
    "put",
    "ran",
    "read",
    "sent",
    "sold",
    "spent",
    "thought",
    "wrote",
    "began",
    "brought",
    "came",
    "forgot",
    "gave",
    "knew",
    "slept",
    "taught",
    "won",
    "finally",
    "just",
    "also",
    "still",
    "never",
    "always",
    "often",
    "usually",
    "really",
    "recently",
    "sometimes",
    "already",
    "even",
    "only",
}


def _third_person(verb: str) -> str:
    low = verb.lower()
    if low in KEEP or low.endswith("ed") or not low.isalpha():
        return verb
    if low == "have":
        return "has"
    if re.search(r"(s|sh|ch|x|z|o)$", low):
        return verb + "es"
    if re.search(r"[^aeiou]y$", low):
        return verb[:-1] + "ies"
    return verb + "s"


def about_user(text: str) -> str:
    """Return a first-person line as a sentence about the user (a text already about the user is kept)."""
    out = text.strip().rstrip(".!?…").strip()
    if not out or re.match(r"(?i)(the )?user\b", out):
        return text.strip()
    for phrase, repl in PHRASES.items():
        out = re.sub(rf"(?i)\b{re.escape(phrase)}\b", repl, out)
    out = re.sub(r"\bI (\w+)", lambda m: f"the user {_third_person(m.group(1))}", out)
    out = re.sub(r"\bI\b", "the user", out)
    first = re.search(r"(?i)\bmy\b", out)
    if first and "the user" not in out[: first.start()].lower():  # "My cousin ..." -> "The user's cousin ..."
        out = out[: first.start()] + "the user's" + out[first.end() :]
    out = re.sub(r"(?i)\b(my|me|mine|myself)\b", lambda m: PRONOUNS[m.group(1).lower()], out)
    if "the user" not in out.lower():
        out = f"the user mentioned that {out[:1].lower()}{out[1:]}"
    return out[:1].upper() + out[1:] + "."
