"""Prompts of the ``amem`` baseline (A-MEM: Agentic Memory for LLM Agents, Xu et al. 2025)."""

AMEM_SYSTEM = (
    "You organise the long-term memory of an assistant as a network of notes, Zettelkasten style. "
    "Each note holds a piece of conversation with keywords, tags and a one-sentence context."
)

AMEM_ANALYSE = """Analyse this new memory note{time}.

<note>
{content}
</note>

Give:
- keywords: the 3-7 most salient keywords (names, things, actions, places);
- context: one sentence saying what the note is about and why it matters (topic, key points, people);
- tags: 3-6 broad category tags for filing it."""

AMEM_EVOLVE = """A new memory note was written:
<new>
content: {content}
context: {context}
keywords: {keywords}
tags: {tags}
</new>

Its nearest existing notes:
{neighbours}

Decide how the memory network evolves:
- links: the labels (like M2) of the nearest notes truly related to the new note; leave empty if none are;
- tags: the new note's tags, refined in the light of its neighbours;
- should_evolve: true if some neighbours' context or tags should change in the light of the new note;
- updates: for each neighbour to change, its label with its new context and new tags."""

AMEM_NEIGHBOUR = """{label}:
  content: {content}
  context: {context}
  keywords: {keywords}
  tags: {tags}"""
