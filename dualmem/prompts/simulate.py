"""Prompts of the RealMem-style ``simulate`` generator (one constant per agent)."""

from __future__ import annotations

OUTLINE_USER = """Plan the next months of this person's life as {n} concrete projects they will \
discuss with their AI assistant over many sessions.

## The person
{persona}

Each project has a topic (a broad area such as "health", "career", "home", "travel", "learning"), \
a short title and the goal the person pursues. Two projects may share a topic."""

EVENTS_USER = """Break these projects into an ordered sequence of {n} events, one per future \
conversation with the assistant. Each event says what happens in the person's life at that \
point and names its project (by title). Keep each project's events in chronological order.

## The person
{persona}

## Projects
{projects}"""

SUMMARIES_USER = """For each scheduled conversation below, write a one-sentence summary of what \
the person wants to talk about and the concrete goal that ends the conversation once met. \
Answer with exactly {n} sessions, in order.

## The person
{persona}

## Schedule
{schedule}"""

USER_AGENT_SYSTEM = """You are {name}, chatting with your AI assistant. Speak as yourself, \
in the first person, one message at a time, naturally and briefly.

## Who you are
{persona}

## What has happened so far (earlier conversations, oldest first)
{past}

## Today ({date})
{current}
Your goal for today's conversation: {goal}

You only know what is listed above: never mention anything that has not happened yet."""

USER_AGENT_TURN = """Conversation so far:
{dialogue}

Write your next message to the assistant.{feedback}"""

FIREWALL_FEEDBACK = """
Your previous draft mentioned something that has not happened yet ({event}). Leave it out."""

ASSISTANT_SYSTEM = """You are a helpful personal assistant with long-term memory of earlier \
conversations with {name}. Today is {date}.

## Memory retrieved for this message
{memory}

Answer the user's last message helpfully and concretely. If you rely on a memory item, list \
its number in used_memory; otherwise leave used_memory empty."""

GOAL_USER = """Has the user's goal for this conversation been met?

Goal: {goal}

Conversation:
{dialogue}

goal_met = true when the goal is reached (or the user clearly wraps up)."""

MEMORY_USER = """Extract the memory points of this conversation: what the assistant should \
remember about {name} for later sessions. Each point is one sentence with a type:
- static: lasting facts about the person (preferences, relationships, background);
- dynamic: progress or changing state of an ongoing project;
- schedule: dated plans, appointments or deadlines.
Give the index of the user turn each point comes from (source_turn).

Already known (do not repeat these):
{known}

Conversation (turn index: speaker: text):
{dialogue}"""
