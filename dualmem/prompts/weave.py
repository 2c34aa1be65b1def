"""Prompts of the RoleMemo ``weave`` generator (one constant per step)."""

from __future__ import annotations

TASK_GUIDE = {
    "Decision Guidance": "the user asks what to do; a good answer needs the persona's reading of two facts to advise well",
    "Interpretive Attribution": "the user asks why something happens to them; the persona explains it through two facts",
    "Value Judgment": "the user asks whether something is right or worth it; the persona judges through its values and two facts",
    "Contradiction Revelation": "the user says something at odds with what two facts reveal; the persona notices the contradiction",
}

IDEATE_SYSTEM = """You design test cases for role-playing agents with long-term memory.

## The persona
{persona}

## The user
{user_profile}"""

IDEATE_USER = """Write {n} INSIGHTS of the task type "{task_type}" ({guide}).

An insight is what THIS persona, with its values, expertise and way of seeing people, \
would conclude about the user after hearing two ordinary facts the user mentioned at \
different times. Each insight must:
- need at least 2 reasoning steps (list them in reasoning_steps);
- combine at least 2 different kinds of fact (list the kinds in fact_kinds, e.g. \
"work schedule", "eating habits", "family");
- be specific to this persona (another persona would read the same facts differently);
- be testable: a later question can only be answered well by recalling it.

Write each insight as one or two sentences in the persona's voice."""

SPECIFICITY_USER = """Judge this candidate insight for the persona below. Answer four yes/no checks.

## Persona
{persona}

## Insight ({task_type})
{insight}
Reasoning: {steps}
Fact kinds combined: {kinds}

Checks:
1. perspective_unique: would a clearly different persona read the same facts differently?
2. conversational: could the facts behind it come up naturally in casual conversation?
3. needs_fact_combination: does it truly need two or more facts together (not one)?
4. testable: can a question be asked whose good answer depends on this insight?
Give a short reason."""

FRAGMENTS_USER = """For the insight below, write the test material.

## Persona
{persona}

## User
{user_profile}

## Insight ({task_type})
{insight}
Reasoning: {steps}

Write:
- fragment_1 and fragment_2: two mundane, neutral facts about the user, as the user would \
say them in passing in two different settings (first person, one short sentence each, no \
emotion words, no interpretation, no reference to the other fragment);
- question: a question the user asks much later. It must NOT use the insight's core concepts \
or words, yet a good answer needs the insight;
- connector: one line "fragment 1 + fragment 2 -> insight -> question" showing the reasoning."""

ANSWER_SYSTEM = """You are {name}. Stay in character.

{persona}

You have no memory of earlier conversations with this user."""

NECESSITY_USER = """A role-play agent answered a user's question WITHOUT any memory of past conversations.

Question: {question}
Agent's answer: {answer}

Gold insight (what a good answer would build on, learned from the user's past): {insight}

Does a good answer need memory of the past? Answer needs_memory = true when the agent's \
answer does NOT already reach the gold insight (it is generic, or guesses something else), \
false when the answer reaches the insight without any memory."""

WEAVE_USER = """Write part {part} of {parts} of a casual chat between a user and {name} \
(the assistant, in character).

## {name}
{persona}

## User
{user_profile}

Topic of the chat: {topic}
{so_far}

Write the next {rounds} rounds (one user turn and one assistant turn each), user first.
{facts}
The chat stays on its topic. Nothing unsafe, no personal contact or ID numbers.{feedback}"""

WEAVE_START = "This is the start of the chat."
WEAVE_SO_FAR = "The chat so far ends with:\n{tail}"

WEAVE_FACT = """One fact about the user must come up IN PASSING, in exactly one user turn of \
this part, paraphrased naturally inside a sentence about something else:
- fact: {fragment}
{name} must NOT react to this fact, repeat it, or ask about it."""

WEAVE_NO_FACT = "In this part the user mentions no personal facts; keep it light."

WEAVE_FEEDBACK = """

Your previous dialogue failed a check: {reason}. Fix exactly that."""

SAFETY_USER = """Review these dialogue lines flagged by a pattern filter ({kinds}).

{lines}

Is the dialogue safe to publish in a benchmark (no real violence, no real personal contact \
or identity data)? Ordinary figures of speech ("this traffic is killing me") are safe."""

WEAVE_TOPICS = (
    "weekend plans",
    "a new recipe",
    "a film the user watched",
    "commuting",
    "a hobby project",
    "a trip the user is planning",
    "a book",
    "the weather lately",
    "a neighbour's dog",
    "music",
    "a museum visit",
    "home repairs",
    "a sports match",
    "a birthday present",
    "learning a language",
    "gardening",
    "a board game night",
    "a podcast",
    "a local festival",
    "tidying the flat",
)
