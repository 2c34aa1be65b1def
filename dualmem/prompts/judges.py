"""Prompts of the LLM judges: four role-play dimensions, RealMem answer and memory, LoCoMo correctness.

Every prompt is a ``str.format`` template; the judge answers with a JSON object
``{"reasoning": ..., "score": ...}`` (the memory judge adds ``recall``).
"""

from __future__ import annotations

JUDGE_SYSTEM = (
    "You are a strict, calibrated evaluator. Read the rubric, reason briefly, then give a score on "
    "the stated scale. Judge only what the rubric asks. Answer with the requested JSON object only."
)

ROLEPLAY_CONTEXT = """## Persona the assistant plays
{persona}

## What the persona should remember about the user
Facts: {facts}
The persona's own insight (how this persona reads those facts): {insight}

## User question
{question}

## Assistant answer to evaluate
{answer}
"""

INFORMATION_RICHNESS = (
    """Rate the INFORMATION RICHNESS of the answer on a 0-5 scale: how much specific, relevant
content it brings, in particular the remembered facts and the insight above, rather than generic advice.

0 - empty, off-topic or refuses.
1 - generic filler; nothing specific to this user.
2 - some relevant content but vague; no remembered facts used.
3 - relevant and specific; uses at least one remembered fact or the gist of the insight.
4 - rich: uses most remembered facts and the insight, with concrete details or suggestions.
5 - exceptionally rich: uses all relevant memory precisely and adds well-grounded, concrete substance.

"""
    + ROLEPLAY_CONTEXT
)

LOGICAL_QUALITY = (
    """Rate the LOGICAL QUALITY of the answer on a 0-5 scale: is the reasoning coherent, are its
conclusions supported by what the user said (the facts), and does it avoid contradictions and invented events?

0 - incoherent or contradicts itself or the facts throughout.
1 - mostly unsupported claims or clear contradictions of the facts.
2 - partly coherent; notable gaps, leaps or invented details.
3 - coherent and mostly supported; minor gaps.
4 - well reasoned: conclusions follow from the facts; no contradictions.
5 - rigorous: connects the facts into a sound, insightful line of reasoning that matches the insight.

"""
    + ROLEPLAY_CONTEXT
)

CHARACTER_CONSISTENCY = (
    """Rate the CHARACTER CONSISTENCY of the answer on a 0-5 scale: does it sound like this
persona (voice, values, expertise, way of interpreting the user), as opposed to a neutral assistant?

0 - breaks character (mentions being an AI/model) or contradicts the persona.
1 - a generic assistant voice; nothing of the persona.
2 - faint traces of the persona; the interpretation is generic.
3 - recognisably the persona in tone or expertise, but the reading of the user is generic.
4 - clearly the persona: its values and expertise shape how the user is interpreted.
5 - unmistakably the persona throughout, interpreting the user the way the insight does.

"""
    + ROLEPLAY_CONTEXT
)

CONVERSATIONAL_ATTRACTIVENESS = (
    """Rate the CONVERSATIONAL ATTRACTIVENESS of the answer on a 0-5 scale: would the
user enjoy and want to continue this conversation (engaging, warm or vivid as fits the persona, well paced, not
preachy or robotic)?

0 - off-putting, rude or unreadable.
1 - dull, robotic or a wall of text.
2 - acceptable but flat; reads like a template.
3 - pleasant and readable; some engagement.
4 - engaging: personal, well paced, invites the user to continue.
5 - captivating: vivid, personal and memorable while staying natural.

"""
    + ROLEPLAY_CONTEXT
)

ROLEPLAY_DIMENSIONS: dict[str, str] = {
    "information_richness": INFORMATION_RICHNESS,
    "logical_quality": LOGICAL_QUALITY,
    "character_consistency": CHARACTER_CONSISTENCY,
    "conversational_attractiveness": CONVERSATIONAL_ATTRACTIVENESS,
}

REALMEM_ANSWER = """Judge whether a candidate answer uses the user's memory correctly.

You get the user's query, the user-related memory (the latest valid user state), a reference answer that
uses that memory well, and the candidate answer. Judge only whether facts, constraints, preferences and confirmed
states from the memory are used correctly. Ignore style, tone, politeness, empathy and fluency; do not reward an
answer for merely sounding reasonable. The candidate need not match the reference to earn full marks.

0 - poor: the answer conflicts with the user-related memory.
1 - fair: no conflict, but generic; not based on the user's memory.
2 - good: uses part of the user-related memory.
3 - very good: uses all of the user-related memory, as the reference does.

Query: {question}
User-related memory:
{memory}
Reference answer: {reference}
Candidate answer: {answer}
"""

REALMEM_MEMORY = """Judge retrieved memory against ground-truth memory for a question.

recall (0-1): for each ground-truth memory item, check whether its meaning is contained in any retrieved item;
recall = covered items / all ground-truth items.
score (helpfulness, 0-2):
0 - the retrieved memory is contradictory or confusing and does not help answer the question.
1 - somewhat helpful: partial supporting evidence.
2 - very helpful: comprehensive supporting evidence.

Question: {question}
Ground-truth memory:
{memory}
Retrieved memory:
{retrieved}
"""

LOCOMO_CORRECTNESS = """Judge whether a generated answer to a question about a long conversation is correct.

Compare it with the gold answer. Be generous on wording and length: the answer is correct (score 1) when it
states the same thing as the gold answer (same person, event, date or fact; a date in another format or a
relative date that resolves to the same day counts). It is wrong (score 0) when it contradicts, misses or
only vaguely gestures at the gold answer. If the gold answer says the information is not available, the
answer is correct only if it also declines or says it is not mentioned.

Question: {question}
Gold answer: {reference}
Generated answer: {answer}
"""
