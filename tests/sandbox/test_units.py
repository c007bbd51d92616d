"""Sans-I/O parts of the sandbox: frames, result validation, breaker, config, compile policy."""

from __future__ import annotations

import math

import msgspec
import pytest
import structlog.testing

from daemon.errors import HookCompileError, HookCrashed, HookResultInvalid
from hooks_runtime import HookBreaker, SandboxConfig, kind_of, validate_result
from hooks_runtime.policy import (
    MATH,
    STATISTICS,
    compile_hook,
    freeze,
    guarded_getattr,
    guarded_inplacevar,
    make_import,
)
from hooks_runtime.protocol import (
    Batch,
    FrameEncoder,
    FrameReader,
    HookCall,
    Result,
    decode_from_worker,
    decode_to_worker,
    encode_state,
)


def test_frames_round_trip_split_anywhere() -> None:
    """Frames survive being fed one byte at a time and come out whole and typed."""
    enc = FrameEncoder()
    state = encode_state({"a": [1]})
    batch = Batch(7, {"eventId": "e"}, state, [HookCall("h", "r1", "wake", "src")])
    empty = Batch(8, {}, encode_state(None), [])
    data = enc.encode(batch) + enc.encode(empty)
    reader = FrameReader(1 << 20)
    bodies = [b for i in range(len(data)) for b in reader.feed(data[i : i + 1])]
    assert [decode_to_worker(b) for b in bodies] == [batch, empty]
    assert reader.pending == 0
    whole = FrameReader(1 << 20)
    assert [decode_to_worker(b) for b in whole.feed(data + data[:3])] == [batch, empty]
    assert whole.pending == 3
    assert [decode_to_worker(b) for b in whole.feed(data[3:])] == [batch, empty]


def test_frame_over_cap_is_a_crash() -> None:
    """A length prefix above the cap is refused before anything is buffered."""
    reader = FrameReader(100)
    with pytest.raises(HookCrashed, match="exceeds the 100-byte cap"):
        reader.feed((101).to_bytes(4, "big") + b"x")


def test_garbage_from_worker_is_a_crash() -> None:
    """Undecodable or wrongly typed worker frames raise HookCrashed, never pickle-like objects."""
    with pytest.raises(HookCrashed):
        decode_from_worker(b"\xc1garbage")
    with pytest.raises(HookCrashed):
        decode_from_worker(msgspec.msgpack.encode({"type": "result", "id": "x"}))
    fields = {"type": "result", "id": 1, "index": 0, "runtime_us": 1, "done_at": 1.0}
    with pytest.raises(HookCrashed):  # a lookahead step's reads must be names
        decode_from_worker(msgspec.msgpack.encode({**fields, "reads": [1, {"x": 2}]}))
    nested = msgspec.msgpack.encode({**fields, "value": None})[:-1] + b"\x91" * 200_000 + b"\xc0"
    with pytest.raises(HookCrashed, match="recursion"):  # a compromised worker's deep value
        decode_from_worker(nested)
    body = msgspec.msgpack.encode(Result(1, 0, 5, 1.0, {"decision": "WAKE"}))
    assert decode_from_worker(body) == Result(1, 0, 5, 1.0, {"decision": "WAKE"})


@pytest.mark.parametrize(
    ("value", "kind", "match"),
    [
        ([], "wake", "must return a dict"),
        ({"decision": "TRADE_INTENT", "reason": "x", "intent": {}}, "wake", "not allowed"),
        ({"decision": "WAKE", "reason": "x"}, "autotrade", "not allowed"),
        ({"decision": "WAKE"}, "wake", "missing required field `reason`"),
        ({"decision": "WAKE", "reason": 3}, "wake", "Expected `str`, got `int` - at `\\$.reason`"),
        ({"decision": "WAKE", "reason": "x", "cooldown": 1}, "wake", "unknown key"),
        ({"decision": "WAKE", "reason": "x", "cooldownSeconds": -1}, "wake", "cooldownSeconds"),
        ({"decision": "WAKE", "reason": "x", "cooldownSeconds": True}, "wake", "cooldownSeconds"),
        ({"decision": "WAKE", "reason": "x", "cooldownSeconds": math.inf}, "wake", "finite"),
        ({"decision": "WAKE", "reason": "x", "data": math.nan}, "wake", "not finite"),
        ({"decision": "WAKE", "reason": "x", "dedupeKey": 5}, "wake", "dedupeKey"),
        (
            {"decision": "TRADE_INTENT", "reason": "x"},
            "autotrade",
            "missing required field `intent`",
        ),
        ({"decision": "ALERT", "reason": "x", "intent": {}}, "wake", "only allowed with"),
        ({"decision": "WAKE", "reason": "x", "data": {1: 2}}, "wake", "key int"),
        ({"decision": "WAKE", "reason": "x", "data": (1,)}, "wake", "tuple is not a JSON"),
        ({"decision": "WAKE", "reason": "\ud800"}, "wake", "not valid UTF-8"),
        ({"decision": "WAKE", "reason": "x" * 70_000}, "wake", "size cap"),
        ({"decision": "WAKE", "reason": "x", "data": freeze({"a": 1})}, "wake", "mappingproxy"),
        ({"decision": "copy", "reason": "x"}, "copytrade", "not allowed"),
    ],
)
def test_invalid_results_are_rejected(value: object, kind: str, match: str) -> None:
    """Every contract breach is a HookResultInvalid naming the problem."""
    with pytest.raises(HookResultInvalid, match=match):
        validate_result(value, kind, 64 * 1024)


def test_subclass_results_fail_exact_type_checks() -> None:
    """dict and str subclasses pass isinstance but not the exact-type check."""

    class D(dict):  # type: ignore[type-arg]
        pass

    class S(str):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = str.__hash__

    with pytest.raises(HookResultInvalid, match="must return a dict, not D"):
        validate_result(D(decision="WAKE", reason="x"), "wake", 1000)
    with pytest.raises(HookResultInvalid, match="S is not a JSON type"):
        validate_result({"decision": S("BOGUS"), "reason": "x"}, "wake", 1000)


def test_deep_nesting_is_rejected() -> None:
    """Nesting deeper than 32 levels is invalid (bounded recursion in the validator)."""
    deep: list[object] = []
    for _ in range(40):
        deep = [deep]
    with pytest.raises(HookResultInvalid, match="deeper"):
        validate_result({"decision": "WAKE", "reason": "x", "data": deep}, "wake", 1 << 20)


def test_breaker_backs_off_exponentially_then_pauses() -> None:
    """Failures double the skip window; the Nth pauses until resume; success clears."""
    now = [0.0]
    b = HookBreaker(1.0, 3.0, 4, clock=lambda: now[0])
    key = ("a", "h")
    b.record(key, "r1", "boom")
    assert b.gate(key, "r1") == ("backoff", "backing off 1.0s after 1 failure(s)")
    now[0] = 1.0
    assert b.gate(key, "r1") is None
    b.record(key, "r1", "boom")
    now[0] = 2.5
    assert b.gate(key, "r1") is not None  # 2 s window
    now[0] = 3.0
    b.record(key, "r1", "boom")
    now[0] = 5.9
    assert b.gate(key, "r1") is not None  # capped at 3 s
    now[0] = 6.0
    b.record(key, "r1", "boom")
    gate = b.gate(key, "r1")
    assert gate is not None and gate[0] == "paused"
    now[0] = 1e9
    assert b.gate(key, "r1") is not None and list(b.paused()) == [key]
    assert b.resume(key) and b.gate(key, "r1") is None
    b.record(key, "r1", "boom")
    b.record(key, "r1", None)
    assert b.failures(key) == 0


def test_breaker_pauses_a_hook_that_fails_every_other_time() -> None:
    """A success ends the backoff but not the count: 4 failures among the last 20
    evaluations pause the hook, however they are interleaved with successes."""
    b = HookBreaker(0.001, 0.001, 4, clock=lambda: 0.0, window=20)
    key = ("a", "h")
    for i in range(6):
        b.record(key, "r1", "boom" if i % 2 == 0 else None, now=float(i))
        assert b.gate(key, "r1", now=float(i) + 0.5) is None
    b.record(key, "r1", "boom", now=6.0)  # the 4th failure in 7 evaluations
    why = "paused after 4 failures in its last 7 evaluations (last: boom); "
    assert b.gate(key, "r1", now=100.0) == ("paused", why + "lift with `marketwake hooks resume`")
    rare = HookBreaker(0.001, 0.001, 4, clock=lambda: 0.0, window=20)
    for i in range(100):  # one failure in 10 stays under 4 in any 20
        rare.record(key, "r1", "boom" if i % 10 == 0 else None, now=float(i))
    assert rare.gate(key, "r1", now=1000.0) is None


def test_an_agent_over_its_restart_budget_has_its_culprits_paused() -> None:
    """Many hooks each timing out rarely (never paused on their own) exhaust the
    agent's worker-restart budget: the hooks that caused restarts in the window
    are paused (a WARNING names them); hooks that never cost a worker keep running,
    and another agent is untouched."""
    b = HookBreaker(0.001, 0.001, 5, clock=lambda: 0.0, max_restarts=6, restart_window=60.0)
    with structlog.testing.capture_logs() as logs:
        for i in range(7):  # 7 timeouts from 7 hooks within 60 s
            b.record(("a", f"h{i}"), "r1", "exceeded", now=float(i), kind="timeout")
        b.record(("a", "calm"), "r1", "bad value", now=7.0, kind="invalid_result")
        b.record(("other", "h0"), "r1", "exceeded", now=7.0, kind="timeout")
    paused = sorted(k for k in b.paused())
    assert paused == [("a", f"h{i}") for i in range(7)]
    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    assert warning["agent"] == "a" and warning["restarts"] == 7
    assert "worker restarts in 60 s" in b.paused()[("a", "h0")][1]
    slow = HookBreaker(0.001, 0.001, 5, clock=lambda: 0.0, max_restarts=6, restart_window=60.0)
    for i in range(20):  # the same count spread over 20 minutes: within budget
        slow.record(("a", f"h{i}"), "r1", "exceeded", now=float(i * 60), kind="timeout")
    assert slow.paused() == {}


def test_breaker_new_revision_starts_clean() -> None:
    """A paused hook runs again once its file changes (a new revision)."""
    b = HookBreaker(1.0, 10.0, 1, clock=lambda: 0.0)
    b.pause(("a", "h"), "r1", "restored from store")
    assert b.gate(("a", "h"), "r1") is not None
    assert b.gate(("a", "h"), "r2") is None


def test_config_rejects_unknown_layers_and_keys() -> None:
    """Typos in the [hooks.sandbox] section fail at startup."""
    with pytest.raises(msgspec.ValidationError, match="unknown sandbox layer"):
        msgspec.convert({"require_layers": ["seccmp"]}, SandboxConfig)
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.convert({"timeout": 1}, SandboxConfig)
    assert msgspec.convert({}, SandboxConfig).timeout_ms == 250.0


def test_kind_comes_from_the_prefix() -> None:
    """wake_/autotrade_/copytrade_ prefixes give the kind; others are rejected."""
    assert kind_of("wake_x.py") == "wake"
    assert kind_of("copytrade_y.py") == "copytrade"
    with pytest.raises(HookCompileError):
        kind_of("helper.py")


@pytest.mark.parametrize(
    "source",
    [
        "class A:\n    pass",
        "from math import _members",
        "def f(_write_=lambda o: o, /):\n    pass",
        "try:\n    pass\nexcept* ValueError:\n    pass",
        "\uff45\uff56\uff41\uff4c('1')",  # NFKC "eval"
        "x = 1\0",
        "def evaluate(e, s):\n    return f'{e.__class__}'",
        "g = (x for x in [1])\ng.gi_frame",
        "y = " + "+".join(["x"] * 3000),
        "while True:\n    break\nbreak",
        "import os as _os",
        "x = 1\n" * 50_000,
    ],
)
def test_policy_rejects_at_compile_time(source: str) -> None:
    """Classes, underscore names, try/except*, NFKC tricks, NUL, deep ASTs, oversize: compile
    errors, whatever exception RestrictedPython or the compiler raised inside."""
    with pytest.raises(HookCompileError):
        compile_hook(source, "<t>", 256 * 1024)


def test_getattr_guard_refuses_dunders_formats_and_modules() -> None:
    """The guard raises for _names, format*, mro, frames, and never hands out a module."""
    import types

    for obj, name in [("x", "format"), ("x", "format_map"), (str, "mro"), (1, "__class__")]:
        with pytest.raises(AttributeError):
            guarded_getattr(obj, name)
    with pytest.raises(TypeError):
        guarded_getattr("x", type("S", (str,), {})("upper"))
    with pytest.raises(AttributeError):
        guarded_getattr(types, "ModuleType")  # attributes of a module: refused
    with pytest.raises(AttributeError):
        guarded_getattr(STATISTICS, "sys")
    assert guarded_getattr(MATH, "floor") is math.floor
    assert guarded_getattr(MATH, "missing", 5) == 5


def test_imports_are_namespaces_only() -> None:
    """Allowed names give immutable namespaces; os, operator, string, json, re are refused."""
    imp = make_import("seed")
    assert imp("math") is MATH
    with pytest.raises(TypeError):
        MATH.floor = None
    for name in ["os", "operator", "string", "json", "re", "sys", "statistics.sys"]:
        with pytest.raises(ImportError):
            imp(name)
    with pytest.raises(ImportError):
        imp("math", level=1)
    with pytest.raises(ImportError):  # only datetime's C code may ask for it, fromlist-less
        imp("_strptime", fromlist=("re",))
    assert imp("random").random() == make_import("seed")("random").random()


def test_a_moving_candle_window_decodes_only_the_new_candle() -> None:
    """The candle series moves by one candle an event: the worker reuses the frozen
    candles it already had (read-only, so shared like an unchanged key), decodes the
    new one, and the whole is exactly what a plain decode gives."""
    import types

    from hooks_runtime.worker import Evaluator

    def window(start: int) -> dict[str, object]:
        bars = [{"close": float(i), "closeTimeMs": i} for i in range(start, start + 5)]
        return {"candles": {"BTC-USD": {"5m": bars}}, "ticks": {}}

    ev = Evaluator(SandboxConfig())
    first = ev.state(encode_state(window(0)))["candles"]["BTC-USD"]["5m"]
    second = ev.state(encode_state(window(1)))["candles"]["BTC-USD"]["5m"]
    assert all(second[i] is first[i + 1] for i in range(4))  # reused, not re-decoded
    assert dict(second[4]) == {"close": 5.0, "closeTimeMs": 5}
    assert isinstance(second, tuple) and isinstance(second[4], types.MappingProxyType)
    with pytest.raises(TypeError):
        second[4]["close"] = 0.0  # type: ignore[index]
    again = ev.state(encode_state(window(9)))["candles"]["BTC-USD"]["5m"]
    assert [c["close"] for c in again] == [9.0, 10.0, 11.0, 12.0, 13.0]


def test_every_change_of_a_window_gives_what_a_plain_decode_gives() -> None:
    """Unchanged, moved on by one, grown, cut short, jumped, several series at once:
    each state is exactly the plain decode, candles still in view are the same
    objects, and candles long out of view do not stay in the worker's cache."""
    import msgspec

    from hooks_runtime import policy
    from hooks_runtime.worker import Evaluator

    def bars(lo: int, hi: int) -> list[dict[str, float]]:
        return [{"close": float(i), "t": float(i)} for i in range(lo, hi)]

    ev = Evaluator(SandboxConfig())
    spans = [(0, 5), (0, 5), (1, 6), (1, 7), (1, 4), (50, 55), (51, 56), (0, 0), (0, 3)]
    before: dict[float, object] = {}
    for k, (lo, hi) in enumerate(spans):
        plain = {"candles": {"X": {"5m": bars(lo, hi), "1h": bars(k, k + 2)}}}
        got = ev.state(encode_state(plain))
        assert got == policy.freeze(msgspec.msgpack.decode(encode_state(plain)))
        row = got["candles"]["X"]["5m"]
        if k in (1, 2, 3, 4, 6):  # the window kept candles it already had: reused
            assert all(c is before[c["t"]] for c in row if c["t"] in before)
        before = {c["t"]: c for c in row}
    for k in range(2000):  # jump every event: nothing reusable, the cache stays small
        ev.state(encode_state({"candles": {"X": {"5m": bars(k * 10, k * 10 + 5)}}}))
    assert len(ev.candle_cache) <= 2 * 5 + 256
    for k in range(200):  # lookahead tables of candles that never come into view
        raws = [msgspec.Raw(msgspec.msgpack.encode(c)) for c in bars(k * 50, k * 50 + 50)]
        assert ev.table(raws) == [policy.freeze(c) for c in bars(k * 50, k * 50 + 50)]
    assert len(ev.candle_cache) <= 2 * 5 + 256


def test_inplacevar_is_table_driven() -> None:
    """x op= y works on numbers, str and list, not on other types or unknown ops."""
    assert guarded_inplacevar("+=", 1, 2) == 3
    assert guarded_inplacevar("+=", [1], [2]) == [1, 2]
    with pytest.raises(TypeError):
        guarded_inplacevar("|=", {1}, {2})
    with pytest.raises(TypeError):
        guarded_inplacevar("@=", 1, 2)


def test_a_worker_never_sent_a_state_refuses_to_reuse_one() -> None:
    """``same_state`` on a worker's first batch is a protocol error (the worker exits)."""
    from daemon.errors import HookCrashed
    from hooks_runtime.protocol import Batch
    from hooks_runtime.worker import Evaluator

    with pytest.raises(HookCrashed):
        Evaluator(SandboxConfig()).run(
            Batch(1, {}, encode_state(None), [], same_state=True), lambda r: None
        )


def test_state_reuse_only_for_unchanged_keys() -> None:
    """The worker reuses a frozen top-level state value only when its bytes are unchanged."""
    from hooks_runtime.worker import Evaluator

    ev = Evaluator(SandboxConfig())
    first = ev.state(encode_state({"candles": [{"c": 1}], "ticks": {"p": 1}}))
    second = ev.state(encode_state({"candles": [{"c": 1}], "ticks": {"p": 2}}))
    assert second["candles"] is first["candles"]
    assert second["ticks"] is not first["ticks"] and second["ticks"]["p"] == 2
    assert ev.state(encode_state([1, {"a": 2}])) == (1, {"a": 2})
    with pytest.raises(TypeError):
        encode_state({"x": object()})


def test_spin_policy_polls_only_for_lone_batches() -> None:
    """Polling starts after a streak of lone batches, stops when batches overlap, and
    pauses for a while after a poll runs out: briefly for a lone late answer, twice
    as long each time polls keep missing (slow hooks), short again after a hit."""
    from hooks_runtime.spin import FIRST_PAUSE, LONE_BEFORE_SPIN, PAUSE_AFTER_MISS, SpinPolicy

    p = SpinPolicy(300)

    def lone_batch(missed: bool = False) -> int:
        spin, token = p.start()
        assert p.alone()
        p.finish(token, missed)
        return spin

    assert [lone_batch() for _ in range(LONE_BEFORE_SPIN)] == [0] * LONE_BEFORE_SPIN
    assert lone_batch() == 300
    a, ta = p.start()
    b, tb = p.start()  # overlapping: the second never polls, neither is alone
    assert (a, b, p.alone()) == (300, 0, False)
    p.finish(tb, False)
    p.finish(ta, False)
    assert lone_batch() == 0  # the overlap reset the streak
    for _ in range(LONE_BEFORE_SPIN):
        lone_batch()

    def next_poll(missed: bool) -> int:
        """Lone batches until one polls (which then misses or not); how many slept."""
        slept = 0
        while True:
            spin, token = p.start()
            p.finish(token, missed and spin > 0)
            if spin:
                return slept
            slept += 1

    assert next_poll(missed=True) == 0
    # polls keep missing (slow hooks): the pauses double up to the cap
    assert [next_poll(missed=True) for _ in range(4)] == [8, 16, 32, 64]
    assert FIRST_PAUSE == 8 and PAUSE_AFTER_MISS == 64
    assert next_poll(missed=False) == 64  # a poll catches its answer...
    assert next_poll(missed=True) == 0
    assert next_poll(missed=False) == FIRST_PAUSE  # ...so a lone miss pauses briefly


def test_an_over_long_dedupe_key_is_an_invalid_result() -> None:
    """A key is stored for weeks: 63 KB keys were a disk-filling attack."""
    from daemon.errors import HookResultInvalid
    from hooks_runtime.decisions import MAX_DEDUPE_KEY
    from hooks_runtime.validate import validate_result

    ok = {"decision": "WAKE", "reason": "r", "dedupeKey": "k" * MAX_DEDUPE_KEY}
    validate_result(ok, "wake", 65536)
    with pytest.raises(HookResultInvalid, match=r"length <= 256 - at `\$.dedupeKey`"):
        validate_result({**ok, "dedupeKey": "k" * 63_000}, "wake", 65536)
