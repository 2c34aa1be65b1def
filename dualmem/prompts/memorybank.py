"""Prompts of the ``memorybank`` baseline (MemoryBank, Zhong et al., AAAI 2024)."""

MEMORYBANK_SYSTEM = (
    "You keep the long-term memory of an assistant that talks with one user over many sessions. "
    "You summarise what happened and what it says about the user. Be factual and concise."
)

MEMORYBANK_SESSION = """Conversation of one session{time}:
<session>
{transcript}
</session>

Summarise this session:
- events: the events and facts of this session in a few sentences (who did what, plans, dates);
- personality: what this session shows about the user's personality, mood, needs and preferences."""

MEMORYBANK_GLOBAL = """Global summary of all past sessions so far (may be empty):
<summary>
{summary}
</summary>

Portrait of the user so far (may be empty):
<portrait>
{portrait}
</portrait>

The newest session{time}:
- events: {events}
- personality: {personality}

Update both:
- summary: a global summary of all sessions, the new one included (at most {budget} words);
- portrait: the user's overall personality, traits, preferences and needs (at most {budget} words)."""
