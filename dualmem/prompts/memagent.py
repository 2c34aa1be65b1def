"""Prompts of the ``memagent`` baseline (MemAgent, arXiv 2507.02259, query-agnostic variant)."""

MEMAGENT_SYSTEM = (
    "You maintain the long-term memory of an assistant that talks with one user over many sessions. "
    "You read the conversation one chunk at a time and keep a single free-text memory. "
    "Write plain text only: short lines, one piece of information per line."
)

MEMAGENT_UPDATE = """Current memory (may be empty):
<memory>
{memory}
</memory>

New chunk of the conversation:
<chunk>
{chunk}
</chunk>

Rewrite the memory so that it keeps everything from the current memory that is still useful and adds what \
the new chunk reveals about the user: events, facts, preferences, plans, feelings, changes of mind \
(with dates when given). Drop what the new chunk makes outdated. The memory must stay under {budget} tokens. \
Answer with the new memory only."""

MEMAGENT_SHORTEN = (
    "Your memory is {tokens} tokens long; the limit is {budget}. "
    "Rewrite it shorter (under {budget} tokens), merging and dropping the least useful lines. "
    "Answer with the shortened memory only."
)

MEMAGENT_FOCUS = """Memory of past conversations with the user:
<memory>
{memory}
</memory>

Question: {question}

Rewrite the memory to keep only what helps answer the question, quoting the relevant lines verbatim. \
Stay under {budget} tokens. Answer with the focused memory only."""
