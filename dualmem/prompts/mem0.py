"""Prompts of the ``mem0-classic`` baseline (Mem0, arXiv 2504.19413: extraction, then update)."""

MEM0_EXTRACT_SYSTEM = """You are a Personal Information Organizer. You extract facts about the user from a \
conversation so that they can be remembered in later conversations: personal details, preferences, plans, \
events, relationships, health, work, habits, opinions and changes of mind.

Rules:
- Extract facts only from the NEW EXCHANGE; the summary and recent messages are context for resolving \
references ("it", "that job") and must not be re-extracted.
- One short self-contained sentence per fact, in the third person ("User works night shifts at a warehouse").
- Keep dates and names exactly as stated; resolve relative dates with the session date when given.
- Extract nothing from greetings, small talk or the assistant's advice; return an empty list if there is nothing."""

MEM0_EXTRACT = """Conversation summary:
{summary}

Recent messages:
{recent}

Session date: {date}

NEW EXCHANGE:
{exchange}

Return the facts of the new exchange."""

MEM0_UPDATE_SYSTEM = """You are a smart memory manager which controls the memory of a system. For a NEW FACT \
you compare it with the most similar EXISTING MEMORIES and choose exactly one operation:
- ADD: the fact is new information not present in memory. Give the fact as `text` and the closest memory's `id`.
- UPDATE: an existing memory is about the same thing but the fact adds detail or changes it (e.g. the user \
changed job, moved, changed their mind). Give the memory's `id` and the merged, up-to-date `text`.
- DELETE: the fact contradicts an existing memory which is no longer true and the fact itself need not be \
stored. Give the memory's `id`.
- NOOP: the fact is already in memory (same meaning), nothing to change. Give that memory's `id`.
Every answer names an `id` shown in EXISTING MEMORIES."""

MEM0_UPDATE = """EXISTING MEMORIES (id: text):
{memories}

NEW FACT:
{fact}

Choose the operation."""

MEM0_SUMMARY = """Update the running summary of a long conversation between a user and an assistant.

Current summary:
{summary}

New messages:
{messages}

Write the updated summary in at most {max_words} words: who the user is, what they are dealing with, \
the main topics and any decisions. Answer with the summary only."""
