"""Scripted offline answers for the data generators (``fake:weave``, ``fake:simulate``; tests use them too).

Each step of the ``weave`` and ``simulate`` graphs is answered by its schema
name, reading what it needs (task type, counts, fragments) from the prompt, so
``dualmem generate ... -m fake:weave`` runs the whole pipeline offline. The
knobs of :class:`WeaveScript` make chosen insights fail a chosen check.
"""

from __future__ import annotations

import re
from typing import Any

WORDS = [
    "amber",
    "birch",
    "cobalt",
    "denim",
    "ember",
    "fjord",
    "garnet",
    "harbor",
    "indigo",
    "juniper",
    "kelp",
    "lagoon",
    "maple",
    "nutmeg",
    "opal",
    "pepper",
    "quartz",
    "russet",
    "saffron",
    "thistle",
    "umber",
    "violet",
    "walnut",
    "yarrow",
]


def _text(messages: list[Any]) -> str:
    return "\n".join(str(m.content) for m in messages)


def _between(text: str, start: str, end: str = "\n") -> str:
    i = text.index(start) + len(start)
    j = text.find(end, i)
    return text[i : j if j >= 0 else None].strip()


def _insight_text(text: str) -> str:
    return text.split("## Insight (", 1)[1].split(")\n", 1)[1].split("\n")[0]


def _number(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    if found is None:
        raise ValueError(f"scripted model: the prompt has no {pattern!r}")
    return int(found.group(1))


def _word(s: str, salt: int) -> str:
    return WORDS[(sum(map(ord, s)) * 7 + salt) % len(WORDS)]


class WeaveScript:
    """Answer every weave step; knobs pick the insights that fail a check."""

    def __init__(
        self,
        *,
        generic: tuple[str, ...] = (),
        easy: tuple[str, ...] = (),
        broken: tuple[str, ...] = (),
        echo: tuple[str, ...] = (),
        kill_on: str | None = None,
    ) -> None:
        self.generic, self.easy, self.broken, self.echo, self.kill_on = generic, easy, broken, echo, kill_on

    def __call__(self, messages: list[Any], tool: str | None) -> Any:
        text = _text(messages)
        if tool == "InsightBatch":
            task = _between(text, 'of the task type "', '"')
            n = int(_between(text, "Write ", " INSIGHTS"))
            return {
                "insights": [
                    {
                        "text": f"{task} insight {k} of {_between(text, 'Name: ')}",
                        "reasoning_steps": ["a", "b"],
                        "fact_kinds": ["work", "sleep"],
                    }
                    for k in range(n)
                ]
            }
        if tool == "SpecificityVerdict":
            ins = _insight_text(text)
            ok = not any(g in ins for g in self.generic)
            return {
                "perspective_unique": ok,
                "conversational": True,
                "needs_fact_combination": True,
                "testable": ok,
                "reason": "too generic" if not ok else "fine",
            }
        if tool == "QuerySeed":
            ins = _insight_text(text)
            if self.kill_on and self.kill_on in ins:
                raise KeyboardInterrupt("killed")  # the process is stopped (a model error would be recorded instead)
            if any(b in ins for b in self.broken):
                return {"nonsense": True}
            a, b = _word(ins, 1), _word(ins, 5)
            if a == b:
                b = WORDS[(WORDS.index(a) + 3) % len(WORDS)]
            tag = "ECHO " if any(e in ins for e in self.echo) else ""
            return {
                "fragment_1": f"{tag}I painted my {a} bookshelf before breakfast",
                "fragment_2": f"My cousin returned the {b} kayak yesterday",
                "question": "EASY question, what now?"
                if any(e in ins for e in self.easy)
                else f"What should I do next about {a}?",
                "connector": "f1 + f2 -> insight -> question",
            }
        if tool == "NecessityVerdict":
            return {"needs_memory": "EASY question" not in text, "reason": "generic answer"}
        if tool == "WovenDialogue":
            facts = [line[len("- fact: ") :] for line in text.splitlines() if line.startswith("- fact: ")]
            rounds, part = _number(r"Write the next (\d+) rounds", text), _number(r"Write part (\d+) of", text)
            turns = []
            for r in range(rounds):
                user = f"Chatting about the weather again, part {part} round {r}."
                reply = "Clouds come and go; a warm drink helps."
                if r < len(facts):
                    user = f"Oh, by the way, {facts[r].lower()}. Anyway, the clouds look heavy."
                    if "ECHO" in facts[r]:
                        reply = f"So {facts[r].lower()}, you say!"
                turns += [{"role": "user", "text": user}, {"role": "assistant", "text": reply}]
            return {"topic": "weather", "turns": turns}
        if tool == "SafetyVerdict":
            return {"safe": True, "reason": "figure of speech"}
        if tool is None:
            return "I would need to know more about you to say."
        raise AssertionError(f"unexpected schema {tool}")


# --------------------------------------------------------------------------- simulate

MARKERS = [
    "tangerine",
    "zeppelin",
    "obsidian",
    "marigold",
    "pelican",
    "cinnabar",
    "gondola",
    "hazelnut",
    "tamarind",
    "xylophone",
]
PROJECTS = [
    {"topic": "home", "title": "Kitchen renovation", "goal": "a new kitchen"},
    {"topic": "pets", "title": "Dog adoption", "goal": "adopt a dog"},
    {"topic": "home", "title": "Garden shed", "goal": "build a shed"},
]


class SimScript:
    """Answer every simulate step; the user agent repeats every event it can see (so a leak would show)."""

    def __init__(self, *, cheat_with: str | None = None) -> None:
        self.cheat_with = cheat_with

    def __call__(self, messages: list[Any], tool: str | None) -> Any:
        text = _text(messages)
        if tool == "ProjectOutline":
            return {"projects": PROJECTS}
        if tool == "EventPlan":
            n = int(_between(text, "ordered sequence of ", " events"))
            titles = [p["title"] for p in PROJECTS]
            return {
                "events": [
                    {"project": titles[i % 3], "title": f"Step {i} {MARKERS[i]}", "detail": f"detail {MARKERS[i]}"}
                    for i in range(n)
                ]
            }
        if tool == "SessionPlans":
            n = int(_between(text, "Answer with exactly ", " sessions"))
            return {"sessions": [{"summary": "catch up", "goal": "get one concrete tip"} for _ in range(n)]}
        if tool == "UserTurn":
            seen = [m for m in MARKERS if m in text.split("Conversation so far:")[0]]
            extra = f" Also {self.cheat_with}!" if self.cheat_with else ""
            return {"message": f"Let us talk about {' and '.join(seen)}.{extra}"}
        if tool == "AssistantTurn":
            has_memory = "(no memory yet)" not in text
            return {"reply": "Here is a concrete tip.", "used_memory": [1] if has_memory else []}
        if tool == "GoalCheck":
            return {"goal_met": text.count(": User: ") >= 2, "reason": "tip given"}
        if tool == "ExtractedMemory":
            current = [m for m in MARKERS if f"{m}." in text or f"{m} " in text]
            return {
                "points": [
                    {"type": "static", "content": "The user lives with a grey cat named Pixel", "source_turn": 0},
                    {
                        "type": "dynamic",
                        "content": f"The user is working on {current[-1] if current else 'something'}",
                        "source_turn": 0,
                    },
                ]
            }
        raise AssertionError(f"unexpected schema {tool}")


WEAVE_SCHEMAS = frozenset(
    {"InsightBatch", "SpecificityVerdict", "QuerySeed", "NecessityVerdict", "WovenDialogue", "SafetyVerdict"}
)
SIMULATE_SCHEMAS = frozenset(
    {"ProjectOutline", "EventPlan", "SessionPlans", "UserTurn", "AssistantTurn", "GoalCheck", "ExtractedMemory"}
)


def generator_answer(messages: list[Any], tool: str | None) -> Any:
    """Answer a weave or simulate step by its schema name; None for any other schema."""
    if tool in WEAVE_SCHEMAS:
        return WeaveScript()(messages, tool)
    if tool in SIMULATE_SCHEMAS:
        return SimScript()(messages, tool)
    return None
