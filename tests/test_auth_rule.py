"""The one rule for whose memory a call reaches (dualmem.auth.whose_memory), the store-namespace rule of the server's
handlers, and the token table."""

from __future__ import annotations

import pytest

from dualmem.auth import AccessDenied, TokenTable, owns_namespace, whose_memory
from dualmem.config import Settings
from dualmem.errors import ConfigurationError


class Runtime:
    def __init__(self, user=None, context=None):
        from langgraph.runtime import ServerInfo

        self.server_info = ServerInfo(assistant_id="a", graph_id="g", user=user) if user is not None else None
        self.context = context


def test_authenticated_identity_wins_and_another_claim_is_refused_naming_no_one():
    from langgraph_sdk.auth.types import StudioUser

    alice = {"identity": "alice", "permissions": []}
    assert whose_memory(Runtime(alice)) == "alice"
    assert whose_memory(Runtime(alice, {"user_id": "alice"})) == "alice"
    with pytest.raises(AccessDenied) as refused:
        whose_memory(Runtime(alice, {"user_id": "bob"}))
    assert "bob" not in str(refused.value)
    with pytest.raises(AccessDenied):
        whose_memory(Runtime(alice, {"options": {"user_id": "bob"}}))
    with pytest.raises(AccessDenied):
        whose_memory(Runtime(alice), claimed=["bob"])  # an input namespace
    with pytest.raises(AccessDenied):
        whose_memory(Runtime(alice), settings=Settings(user_id="x"), claimed=["bob"])
    ops = {"identity": "ops", "permissions": ["dualmem:admin"]}
    assert whose_memory(Runtime(ops, {"user_id": "bob"})) == "bob"
    assert whose_memory(Runtime(StudioUser("langgraph-studio-user"), {"user_id": "bob"})) == "bob"


def test_without_authentication_the_named_user_then_the_setting_then_the_only_user():
    assert whose_memory(claimed=["theo"]) == "theo"
    with pytest.raises(AccessDenied):
        whose_memory(claimed=["theo", "ines"])
    assert whose_memory(settings=Settings(user_id="u2"), users=["u1"]) == "u2", "an explicit user wins"
    assert whose_memory(settings=Settings(user_id=""), users=["u1"]) == "u1"
    with pytest.raises(ConfigurationError, match="several users"):
        whose_memory(settings=Settings(user_id=""), users=["u1", "u3"])
    assert whose_memory(settings=Settings(user_id="")) == "user"
    with pytest.raises(ValueError):
        whose_memory(claimed=["../x"])


def test_store_namespaces_owned_by_the_caller():
    assert owns_namespace(("dualmem", "mara", "alice", "fact"), "alice")
    assert owns_namespace(("dualmem_pending", "mara", "alice", "t1"), "alice")
    assert owns_namespace(("alice", "notes"), "alice")
    for wide in [(), ("dualmem",), ("dualmem", "mara"), ("dualmem", "mara", "bob"), ("bob",), ("memories", "alice")]:
        assert not owns_namespace(wide, "alice"), wide


def test_token_table():
    table = TokenTable(
        {"tok-alice-0001": "alice", "tok-ops-00002": {"identity": "ops", "permissions": ["dualmem:admin"]}}
    )
    assert table.lookup("tok-alice-0001").identity == "alice" and not table.lookup("tok-alice-0001").admin
    assert table.lookup("tok-ops-00002").admin
    assert table.lookup("tok-alice-000") is None and table.lookup(None) is None
    with pytest.raises(ConfigurationError, match="8"):
        TokenTable({"short": "alice"})
    with pytest.raises(ValueError):
        TokenTable({"tok-evil-00001": "../root"})
