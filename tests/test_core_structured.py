from __future__ import annotations

import asyncio

from langchain_core.messages import HumanMessage

from dualmem.models.structured import ainvoke_structured, extract_json, invoke_structured
from dualmem.schema import FactOp, MemoryUpdate
from dualmem.testing import FakeChatModel

GOOD = MemoryUpdate(facts=[FactOp(op="ADD", id="N1", text="works night shifts")])


def test_valid_answer_first_time():
    out = invoke_structured(FakeChatModel(responses=[GOOD]), [HumanMessage("x")], MemoryUpdate)
    assert out.ok and out.attempts == 1 and out.value == GOOD


def test_malformed_answer_is_repaired_with_error_fed_back():
    model = FakeChatModel(responses=["not json", {"facts": [{"op": "MERGE", "id": "N1"}]}, GOOD])
    out = invoke_structured(model, [HumanMessage("x")], MemoryUpdate, retries=2)
    assert out.ok and out.attempts == 3
    # the third request carries the validation error of the second answer
    assert "MERGE" in model.calls[2][-2].content or "op" in model.calls[2][-1].content
    assert "could not be used" in model.calls[2][-1].content


def test_failure_after_retries_is_reported_not_raised():
    out = invoke_structured(FakeChatModel(responses=["nope"]), [HumanMessage("x")], MemoryUpdate, retries=1)
    assert not out.ok and out.attempts == 2 and out.error and out.raw == ["nope", "nope"]


def test_async_path_shares_the_core():
    model = FakeChatModel(responses=["bad", GOOD])
    out = asyncio.run(ainvoke_structured(model, [HumanMessage("x")], MemoryUpdate))
    assert out.ok and out.attempts == 2


def test_extract_json_handles_fences_and_trailing_text():
    assert extract_json('sure:\n```json\n{"a": 1}\n```') == {"a": 1}
    assert extract_json('{"a": {"b": 2}} and more {') == {"a": {"b": 2}}


def test_a_process_making_a_model_per_request_does_not_keep_them_all():
    """Structured runnables are built once per model, and models used long ago are let go with them."""
    import gc
    import weakref

    from dualmem.models.structured import _structured_runnable

    kept = FakeChatModel(responses=[GOOD])
    first = _structured_runnable(kept, MemoryUpdate, None)
    gone = []
    for _ in range(100):  # a model per request, as a server holding users' own keys makes them
        model = FakeChatModel(responses=[GOOD])
        assert invoke_structured(model, [HumanMessage("x")], MemoryUpdate).ok
        gone.append(weakref.ref(model))
        assert _structured_runnable(kept, MemoryUpdate, None) is first  # a model in use keeps its runnable
    del model
    gc.collect()
    assert sum(ref() is not None for ref in gone) <= 16  # the last few are kept, not a hundred
