"""The [rag] config section and the per-client rate limiter."""

from __future__ import annotations

import msgspec
import pytest

from daemon.config import parse
from daemon.errors import ConfigError, StoreError
from daemon.rag.config import RagConfig
from daemon.rag.limits import RateLimiter
from daemon.rag.store import open_store
from daemon.secret import Secret


def test_absent_section_gives_defaults() -> None:
    """No [rag] at all: loopback 7879, an embedded store beside the daemon's state,
    numeric embedding, seed query defaults."""
    rag = parse("").rag
    assert rag == msgspec.structs.replace(
        RagConfig(), store=msgspec.structs.replace(RagConfig().store, path="state/rag")
    )
    assert (rag.server.host, rag.server.port) == ("127.0.0.1", 7879)
    assert (rag.store.kind, rag.embedding.model) == ("embedded", "numeric")
    q = rag.query_defaults
    assert (q.lookback_days, q.top_k, q.min_similarity, q.min_matches) == (90, 5, 0.7, 3)


def test_the_store_path_follows_the_state_dir_unless_set() -> None:
    """Unset, the embedded store is <state_dir>/rag, wherever the state dir is moved; a
    path given is kept; a store config used without a loaded Config opens nowhere."""
    moved = parse('[daemon]\nstate_dir = "/srv/mw"\n').rag.store.path
    assert moved == "/srv/mw/rag"
    kept = parse('[daemon]\nstate_dir = "/srv/mw"\n[rag.store]\npath = "/data/rag"\n')
    assert kept.rag.store.path == "/data/rag"
    with pytest.raises(StoreError, match=r"\[rag.store\] path is not set"):
        open_store(RagConfig().store)


def test_nested_sections_decode() -> None:
    """Sub-sections are read from TOML with their types."""
    rag = parse(
        '[rag.server]\nport = 9000\napi_key = "k"\n[rag.store]\nkind = "qdrant"\n'
        'url = "http://q:6333"\n[rag.query_defaults]\ntop_k = 7\n'
    ).rag
    assert (rag.server.port, rag.server.api_key, rag.store.kind, rag.query_defaults.top_k) == (
        9000,
        Secret("k"),
        "qdrant",
        7,
    )


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[rag.server]\nprot = 1\n", "unknown key 'prot'"),
        ('[rag.store]\nkind = "sqlite"\n', "rag.store.kind"),
        ("[rag.query_defaults]\ntop_k = 99\n", "top_k"),
        ('[rag.embedding]\nmodel = "gpt"\n', "rag.embedding.model"),
    ],
)
def test_bad_values_name_the_key(text: str, fragment: str) -> None:
    """Typos and out-of-range values fail with the key path."""
    with pytest.raises(ConfigError, match=fragment):
        parse(text)


def test_rate_limiter_bucket() -> None:
    """Burst is spent, refills at the rate, and is tracked per client."""
    now = [0.0]
    rl = RateLimiter(2.0, 3, clock=lambda: now[0])
    assert [rl.allow("a") for _ in range(4)] == [True, True, True, False]
    assert rl.retry_after_ms("a") == 501
    assert rl.allow("b")
    now[0] = 0.5
    assert rl.allow("a") and not rl.allow("a")


def test_rate_limiter_off_and_bounded() -> None:
    """Rate 0 never limits; the bucket table stays bounded under many clients."""
    assert all(RateLimiter(0.0, 1).allow("x") for _ in range(100))
    rl = RateLimiter(1.0, 1, max_clients=10)
    for i in range(100):
        rl.allow(str(i))
    assert len(rl._buckets) == 10
