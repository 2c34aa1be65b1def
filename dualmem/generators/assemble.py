"""Long-history assembly: woven evidence sessions + templated filler, to a target token length.

Pure and seeded: the same woven sessions, target and seed give the same
history. Each woven dialogue is split between its two fragment turns so the
two fragments of one query land in different sessions ``fragment_distance``
sessions apart; the first part is placed at a depth (beginning / middle / end)
cycling over the queries. Tokens are counted with :mod:`dualmem.models.tokens` over
the turn texts; the total lands within ``tolerance`` of the target. Every
evidence position is recorded (session id, turn id, depth fraction).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from dualmem.models.tokens import count_tokens_batch
from dualmem.schema import DatasetItem, Dialogue, GoldEvidence, Persona, Query, Session, Turn

# depth slots as fractions of the history; the queries of one slot spread evenly inside it
DEPTHS: dict[str, tuple[float, float]] = {"beginning": (0.02, 0.25), "middle": (0.4, 0.6), "end": (0.75, 0.98)}

FILLER_TOPICS: dict[str, tuple[list[str], list[str]]] = {
    "weather": (
        [
            "The sky has been so grey all week, do you think it will clear up?",
            "It rained the whole afternoon again.",
            "I love it when the first warm day of the year finally shows up.",
            "The wind this morning was wild.",
        ],
        [
            "Grey weeks wear on everyone; a short walk at noon still helps.",
            "Rainy afternoons are made for a warm drink.",
            "That first warm day always feels like a small holiday.",
            "Hold on to your hat, then!",
        ],
    ),
    "movies": (
        [
            "I finally watched that old detective film everyone keeps quoting.",
            "Do you prefer comedies or dramas on a lazy evening?",
            "The soundtrack of that space movie is stuck in my head.",
            "I fell asleep halfway through the film last night.",
        ],
        [
            "Old detective films have a rhythm modern ones rarely match.",
            "Comedies for tired evenings, dramas for rested ones.",
            "A good soundtrack stays longer than the plot.",
            "Then the film did its job as a lullaby.",
        ],
    ),
    "cooking": (
        [
            "I tried baking bread and it came out flat as a plate.",
            "What do you put in a simple vegetable soup?",
            "I bought way too many lemons at the market.",
            "My pasta sauce tasted better the second day.",
        ],
        [
            "Flat bread is still bread; the dough probably needed more time.",
            "Onion, carrot, whatever is in the fridge, and patience.",
            "Lemons never go to waste: tea, dressing, cake.",
            "Sauces always do; the flavours settle overnight.",
        ],
    ),
    "music": (
        [
            "I've been humming the same tune for two days.",
            "Do you think vinyl really sounds better?",
            "A street musician played the violin near the station today.",
            "I want to learn a few chords on the guitar.",
        ],
        [
            "Tunes like that usually leave when they are ready.",
            "It sounds warmer to some ears; mostly it feels better.",
            "Street music makes a station feel less like a corridor.",
            "Three chords carry a surprising number of songs.",
        ],
    ),
    "travel": (
        [
            "I keep looking at photos of seaside towns.",
            "Trains or planes, which do you prefer?",
            "I found an old map of the city in a drawer.",
            "Someday I'd like to see the northern lights.",
        ],
        [
            "Seaside towns look best slightly out of season.",
            "Trains: you arrive with your thoughts still in one piece.",
            "Old maps are lovely; half the streets have new names now.",
            "Winter nights up north are worth the cold, people say.",
        ],
    ),
    "books": (
        [
            "I started a novel that opens with a very long storm.",
            "Short stories or long novels?",
            "The library by the park reopened.",
            "I keep buying books faster than I read them.",
        ],
        [
            "Storm openings promise a lot; let's see if it keeps it.",
            "Short stories for busy weeks, novels for slow ones.",
            "A reopened library is good news for the whole street.",
            "A shelf of unread books is a kind of optimism.",
        ],
    ),
    "plants": (
        [
            "My basil plant looks sad again.",
            "Someone gave me a cactus shaped like a star.",
            "The tomatoes on the balcony finally turned red.",
            "Is it true plants like being talked to?",
        ],
        [
            "Basil wants sun and a bit less water than people think.",
            "Star cactus, easy company: ignore it politely.",
            "Balcony tomatoes taste better than any bought ones.",
            "They like the attention you pay them while talking, at least.",
        ],
    ),
    "games": (
        [
            "We played an old board game and it got very competitive.",
            "I tried a crossword and got stuck on the last word.",
            "Do you like puzzles with a thousand pieces?",
            "Chess in the park looks so calm from outside.",
        ],
        [
            "Board games reveal everyone's secret competitive side.",
            "The last word is always the stubborn one.",
            "A thousand pieces is a whole weekend, and a nice one.",
            "Calm on the outside, storms in their heads.",
        ],
    ),
    "animals": (
        [
            "A neighbour's cat sat on my doorstep all morning.",
            "I saw a heron by the canal today.",
            "Dogs in raincoats are the best thing about rainy days.",
            "The pigeons at the square are getting bold.",
        ],
        [
            "Cats choose doorsteps with care; consider yourself chosen.",
            "Herons look like they are thinking very hard.",
            "Nothing lifts a grey street like a dog in a raincoat.",
            "Bold pigeons know exactly who carries crumbs.",
        ],
    ),
    "city": (
        [
            "They opened a new bakery at the corner.",
            "The bus was late again, as usual.",
            "There's a small festival in the square this weekend.",
            "They painted a mural on the old wall by the bridge.",
        ],
        [
            "A new bakery is a good reason to take the long way round.",
            "Buses keep their own calendar.",
            "Small festivals are the best kind: music, food, no crowds.",
            "Murals make a wall into a landmark.",
        ],
    ),
}


def filler_session(rng: random.Random, rounds: int) -> tuple[str, list[dict[str, str]]]:
    """Return (topic, turns) of one casual templated chat with no evidence in it."""
    topic = rng.choice(sorted(FILLER_TOPICS))
    users, replies = FILLER_TOPICS[topic]
    turns: list[dict[str, str]] = []
    for _ in range(rounds):
        i = rng.randrange(len(users))
        turns.append({"role": "user", "text": users[i]})
        turns.append({"role": "assistant", "text": replies[i] if rng.random() < 0.7 else rng.choice(replies)})
    return topic, turns


def split_woven(
    turns: Sequence[dict[str, Any]], fragment_turns: Sequence[int | None], distance: int
) -> list[list[int]]:
    """Return the turn indices of the parts a woven dialogue is placed as (one, or two split between the fragments)."""
    idx = list(range(len(turns)))
    known = sorted(t for t in fragment_turns if t is not None)
    if distance <= 0 or len(known) < 2 or known[0] == known[1]:
        return [idx]
    cut = known[1]
    while cut > known[0] + 1 and turns[cut].get("role") != "user":
        cut -= 1
    return [idx[:cut], idx[cut:]]


def _positions(fill_tokens: list[int], fraction: float, distance: int) -> tuple[int, int]:
    """Return insertion points (before filler index) of part A at ``fraction`` depth and part B ``distance`` later."""
    n = len(fill_tokens)
    total = sum(fill_tokens) or 1
    acc, pos = 0, n
    for i, tok in enumerate(fill_tokens):
        if acc / total >= fraction:
            pos = i
            break
        acc += tok
    pos_a = max(0, min(pos, n - distance))
    return pos_a, min(n, pos_a + distance)


def assemble_history(
    persona: Persona,
    woven: Sequence[dict[str, Any]],
    target_tokens: int,
    *,
    seed: int = 0,
    depths: Sequence[str] = ("beginning", "middle", "end"),
    fragment_distance: int = 2,
    tolerance: float = 0.05,
    filler_rounds: tuple[int, int] = (10, 24),
    start: datetime | None = None,
    user_id: str = "user",
) -> tuple[DatasetItem, dict[str, Any]]:
    """Build one history of ``target_tokens`` (± ``tolerance``) from woven items and filler; return (item, stats).

    ``woven`` items carry ``query_id, question, task_type, fragments, insight,
    turns, fragment_turns`` (and optionally ``answer``). Items that do not fit
    the target are left out and listed in ``stats["dropped"]``.
    """
    rng = random.Random(f"{persona.id}:{target_tokens}:{seed}")
    unknown = [d for d in depths if d not in DEPTHS]
    if unknown:
        raise ValueError(f"unknown depth(s) {unknown}; use {', '.join(DEPTHS)}")
    parts: list[tuple[int, list[int], int]] = []  # (woven index, turn indices, part number)
    tok_of: list[list[int]] = [count_tokens_batch([str(t["text"]) for t in w["turns"]]) for w in woven]
    budget_hi = target_tokens * (1 + tolerance)
    kept: list[int] = []
    dropped: list[str] = []
    evidence_tokens = 0
    for i, w in enumerate(woven):
        need = sum(tok_of[i])
        if evidence_tokens + need <= budget_hi:
            kept.append(i)
            evidence_tokens += need
        else:
            dropped.append(w["query_id"])
    for i in kept:
        for p_no, idx in enumerate(
            split_woven(woven[i]["turns"], woven[i].get("fragment_turns") or [], fragment_distance)
        ):
            parts.append((i, idx, p_no))
    # filler to the target: whole sessions, then turns of one more session
    fillers: list[tuple[str, list[dict[str, str]], list[int]]] = []
    total = evidence_tokens
    while total < target_tokens:
        topic, turns = filler_session(rng, rng.randint(*filler_rounds))
        toks = count_tokens_batch([t["text"] for t in turns])
        if total + sum(toks) <= target_tokens:
            fillers.append((topic, turns, toks))
            total += sum(toks)
            continue
        n = 0
        while n < len(turns) and total + toks[n] <= target_tokens:
            total += toks[n]
            n += 1
        if total < target_tokens * (1 - tolerance):  # one more turn overshoots less than it misses
            total += toks[n]
            n += 1
        if n:
            fillers.append((topic, turns[:n], toks[:n]))
        break
    # placement
    fill_tokens = [sum(f[2]) for f in fillers]
    slots: dict[int, list[tuple[int, list[int], int]]] = {}
    depth_of: dict[int, str] = {}
    slot_of = [depths[q_no % len(depths)] for q_no in range(len(kept))]
    for q_no, i in enumerate(kept):
        depth = slot_of[q_no]
        lo, hi = DEPTHS[depth]
        rank, count = slot_of[:q_no].count(depth), slot_of.count(depth)
        mine = [p for p in parts if p[0] == i]
        pos_a, pos_b = _positions(
            fill_tokens, lo + (hi - lo) * (rank + 0.5) / count, fragment_distance if len(mine) > 1 else 0
        )
        depth_of[i] = depth
        for p in mine:
            slots.setdefault(pos_a if p[2] == 0 else pos_b, []).append(p)
    order: list[tuple[str, Any]] = []
    for f_i in range(len(fillers) + 1):
        order.extend(("woven", p) for p in slots.get(f_i, []))
        if f_i < len(fillers):
            order.append(("filler", f_i))
    # sessions with ids and increasing dates
    dialogue_id = f"{persona.id}-{target_tokens // 1000}k" if target_tokens >= 1000 else f"{persona.id}-{target_tokens}"
    clock = start or datetime(2024, 1, 1, 9, 0)
    sessions: list[Session] = []
    where: dict[tuple[int, int], tuple[str, str, int]] = {}  # (woven, turn index) -> (session, turn id, token offset)
    offset = 0
    for s_no, (kind, ref) in enumerate(order):
        clock += timedelta(days=rng.randint(1, 3), hours=rng.randint(0, 10), minutes=rng.randint(0, 59))
        sid = f"{dialogue_id}-s{s_no:04d}"
        if kind == "filler":
            topic, raw, toks = fillers[ref]
            idx, meta, filler = list(range(len(raw))), {"topic": topic}, True
        else:
            w_i, idx, _ = ref
            raw, toks = woven[w_i]["turns"], tok_of[w_i]
            meta, filler = (
                {"topic": woven[w_i].get("topic", "")},
                False,
            )  # no query ids: nothing in a session hints at evidence
        session_turns: list[Turn] = []
        for j, t_i in enumerate(idx):
            tid = f"{sid}-t{j:03d}"
            speaker = persona.name if raw[t_i]["role"] == "assistant" else "User"
            session_turns.append(Turn(id=tid, role=raw[t_i]["role"], speaker=speaker, text=str(raw[t_i]["text"])))
            if kind == "woven":
                where[(ref[0], t_i)] = (sid, tid, offset)
            offset += toks[t_i]
        sessions.append(
            Session(id=sid, time=clock.isoformat(timespec="minutes"), turns=session_turns, filler=filler, meta=meta)
        )
    queries = []
    session_index = {s.id: n for n, s in enumerate(sessions)}
    for i in kept:
        w = woven[i]
        evidence = []
        for frag, t_i in zip(w["fragments"], w.get("fragment_turns") or [None, None], strict=False):
            if t_i is None or (i, t_i) not in where:
                continue
            sid, tid, off = where[(i, t_i)]
            evidence.append(
                {"session_id": sid, "turn_id": tid, "fragment": frag, "depth": round(off / max(offset, 1), 4)}
            )
        s_nos = [session_index[e["session_id"]] for e in evidence]
        queries.append(
            Query(
                id=w["query_id"],
                text=w["question"],
                task_type=w["task_type"],
                answer=w.get("answer"),
                time=(clock + timedelta(days=1)).isoformat(timespec="minutes"),
                gold=GoldEvidence(
                    facts=list(w["fragments"]),
                    insight=w["insight"],
                    session_ids=list(dict.fromkeys(e["session_id"] for e in evidence)),
                    turn_ids=[e["turn_id"] for e in evidence],
                ),
                meta={
                    "evidence": [{k: e[k] for k in ("session_id", "turn_id", "fragment")} for e in evidence],
                    "evidence_depths": [e["depth"] for e in evidence],
                    "depth_slot": depth_of.get(i),
                    "fragment_distance_sessions": (max(s_nos) - min(s_nos) - 1)
                    if len(s_nos) == 2 and s_nos[0] != s_nos[1]
                    else 0,
                    "insight_id": w.get("insight_id"),
                    "connector": w.get("connector", ""),
                },
            )
        )
    positions = [
        {
            "query_id": q.id,
            "slot": q.meta["depth_slot"],
            "session_id": e["session_id"],
            "turn_id": e["turn_id"],
            "depth": d,
        }
        for q in queries
        for e, d in zip(q.meta["evidence"], q.meta["evidence_depths"], strict=True)
    ]
    stats = {
        "target_tokens": target_tokens,
        "total_tokens": offset,
        "within_tolerance": abs(offset - target_tokens) <= tolerance * target_tokens,
        "sessions": len(sessions),
        "filler_sessions": len(fillers),
        "evidence_sessions": len(sessions) - len(fillers),
        "queries": len(queries),
        "dropped": dropped,
        "evidence": positions,
    }
    dialogue = Dialogue(
        id=dialogue_id, persona=persona, user_id=user_id, sessions=sessions, meta={"assembly": {**stats, "seed": seed}}
    )
    return DatasetItem(dialogue=dialogue, queries=queries), stats
