"""Prompts of the ``bookmarks`` baseline (BOOKMARKS-style search memory: question–answer bookmarks)."""

BOOKMARKS_SYSTEM = (
    "You keep bookmarks on a long conversation between an assistant and one user: questions about the "
    "user's story with their answers as of a point of the story. Answer only from the excerpts you are given."
)

BOOKMARKS_PROPOSE = """An assistant{persona} must handle this task:
<task>
{task}
</task>

Propose up to {n} short, self-contained questions about the user's past conversations whose answers the \
assistant needs for the task (facts, events, preferences, changes over time). One question per need."""

BOOKMARKS_CREATE = """Question: {question}

Excerpts of the conversation history (sessions up to {point}):
{excerpts}

Answer the question from these excerpts, as of the latest session shown. Say briefly when the excerpts \
do not tell. Keep it under 80 words."""

BOOKMARKS_DERIVE = """Question: {question}

Answer bookmarked as of {old_point}:
<answer>
{answer}
</answer>

Excerpts of the sessions that came after that point (up to {point}):
{excerpts}

Bring the answer up to date: keep what still holds, change what these newer sessions change, add what \
they add. Set changed to false when they change nothing. Keep it under 80 words."""
