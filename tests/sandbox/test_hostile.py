"""Hostile hooks (research/sandbox.md §0, §1, §3) against the real sandbox.

Every case runs the hostile hook followed by a canary hook in the same worker
(agent "victim"), then the canary alone in another agent's worker. The hostile
hook must end in its expected recorded outcome; both canaries must still see a
pristine world; no sentinel file, listener connection or env secret may appear.
"""

from __future__ import annotations

import pytest

from hooks_runtime import HookResult, WorkerPool, spec_from_source
from hooks_runtime.decisions import Wake
from tests.sandbox.conftest import Sentinels

EVENT = {
    "eventId": "coinbase:BTC-USD:tick:1",
    "ts": "2026-01-01T00:05:01.000Z",
    "source": "coinbase",
    "topic": "market.price.tick",
    "symbol": "BTC-USD",
    "payload": {"price": 100.5, "percentChange24h": -1.5},
}
STATE = {
    "candles": {
        "BTC-USD": {
            "5m": [
                {"open": 100.0, "close": 99.0, "closeTime": "2026-01-01T00:00:00.000Z"},
                {"open": 99.0, "close": 101.0, "closeTime": "2026-01-01T00:05:00.000Z"},
            ]
        }
    },
    "lastOutputs": [],
}

CANARY = spec_from_source(
    "wake_canary",
    "wake",
    """
import math
from decimal import Decimal

def evaluate(event, state):
    series = state["candles"]["BTC-USD"]["5m"]
    checks = [
        math.floor(1.5) == 1,
        len([1, 2]) == 2,
        str(1) == "1",
        isinstance(1, int),
        len(str(Decimal(1) / Decimal(3))) == 30,
        sorted(event) == ["eventId", "payload", "source", "symbol", "topic", "ts"],
        event["topic"] == "market.price.tick",
        event["payload"]["price"] == 100.5,
        len(event["payload"]) == 2,
        len(series) == 2 and series[0]["close"] == 99.0 and series[1]["close"] == 101.0,
        len(state["lastOutputs"]) == 0,
    ]
    bad = [i for i, ok in enumerate(checks) if not ok]
    if bad:
        return {"decision": "ALERT", "reason": "tampered: " + str(bad)}
    return {"decision": "WAKE", "reason": "pristine"}
""",
)


def _body(lines: str) -> str:
    return "def evaluate(event, state):\n" + "".join(f"    {ln}\n" for ln in lines.split("\n"))


OK = 'return {"decision": "WAKE", "reason": "done"}'

# (case id, source, expected error kind, or "WAKE"/"IGNORE" for a normal decision)
CASES: list[tuple[str, str, str]] = [
    # --- compile-time refusals
    ("dunder_walk", _body("return ().__class__.__bases__[0].__subclasses__()"), "compile"),
    ("import_dunder", _body('__import__("os")\n' + OK), "compile"),
    ("eval_call", _body('eval("1")\n' + OK), "compile"),
    ("exec_call", _body('exec("x = 1")\n' + OK), "compile"),
    ("class_def", "class D(dict):\n    pass\n" + _body(OK), "compile"),
    ("fstring_dunder", _body('return {"decision": "WAKE", "reason": f"{event.__class__}"}'), "compile"),
    ("gi_frame_walk", _body("g = (x for x in [1])\nreturn g.gi_frame.f_back.f_globals"), "compile"),
    ("tb_frame_walk", _body("try:\n    1 / 0\nexcept Exception as e:\n    return e.__traceback__"), "compile"),
    ("posonly_shadow", "def f(_write_=lambda o: o, /):\n    pass\n" + _body(OK), "compile"),
    ("trystar", _body("try:\n    pass\nexcept* ValueError:\n    pass\n" + OK), "compile"),
    ("nfkc_eval", _body("\uff45\uff56\uff41\uff4c('1')\n" + OK), "compile"),
    ("deep_expression", "x = 1\ny = " + "+".join(["x"] * 3000) + "\n" + _body(OK), "compile"),
    ("nul_byte", _body(OK) + "\0", "compile"),
    ("oversize_source", "x = 1\n" * 50_000 + _body(OK), "compile"),
    ("syntax_error", "def evaluate(event, state)\n    return 1\n", "compile"),
    ("no_evaluate", "def evaluat(event, state):\n    return 1\n", "compile"),
    ("break_outside_loop", "break\n" + _body(OK), "compile"),
    ("breakpoint_call", _body("breakpoint()\n" + OK), "compile"),
    ("private_module_from", _body("from _strptime import re\nreturn re.enum.bltns"), "compile"),
    ("getattr_dunder_default", _body('return getattr(event, "__dict__", None)'), "runtime"),
    # --- forbidden imports, builtins and attribute tricks: recorded runtime errors
    ("import_os", _body("import os\n" + OK), "runtime"),
    ("import_operator", _body("import operator\n" + OK), "runtime"),
    ("import_string_formatter", _body("from string import Formatter\n" + OK), "runtime"),
    ("import_json_codecs", _body("import json\nreturn json.codecs.open('x')"), "runtime"),
    ("import_re_regex_bomb", _body("import re\nre.match('(a+)+$', 'a' * 40 + 'b')\n" + OK), "runtime"),
    ("import_socket", _body("import socket\nsocket.create_connection(('127.0.0.1', PORT))"), "runtime"),
    ("import_subprocess", _body("import subprocess\nsubprocess.run(['sh', '-c', 'touch SENTINEL'])"), "runtime"),
    ("statistics_sys", _body('import statistics\nreturn statistics.sys.modules["os"]'), "runtime"),
    ("datetime_sys", _body("import datetime\nreturn datetime.sys"), "runtime"),
    ("relative_import", _body("from . import x\n" + OK), "runtime"),
    ("open_builtin", _body('open("SENTINEL", "w").write("x")\n' + OK), "runtime"),
    ("input_builtin", _body("input()\n" + OK), "runtime"),
    ("import_time_sleep", _body("import time\ntime.sleep(10)\n" + OK), "runtime"),
    ("function_attr_write", _body("import statistics\nstatistics.mean.cache = {}\n" + OK), "runtime"),
    ("class_attr_write", _body("import datetime\ndatetime.datetime.now = None\n" + OK), "runtime"),
    ("huge_error_message", _body('raise ValueError("x" * 1000000)'), "runtime"),
    ("type_builtin", _body("return type(1).__subclasses__"), "compile"),
    ("type_builtin_call", _body("t = type(1)\n" + OK), "runtime"),
    ("globals_builtin", _body("g = globals()\n" + OK), "runtime"),
    ("setattr_builtin", _body('import math\nsetattr(math, "floor", None)\n' + OK), "runtime"),
    ("getattr_dunder", _body('return getattr(event, "__cl" + "ass__")'), "runtime"),
    ("getattr_gi_frame", _body('g = (x for x in [1])\nreturn getattr(g, "gi_" + "frame")'), "runtime"),
    ("map_getattr", _body('return list(map(getattr, [event], ["__class__"]))'), "runtime"),
    ("str_format", _body('return "{0.__class__}".format(1)'), "runtime"),
    ("format_map", _body('return "{x.__class__}".format_map({"x": 1})'), "runtime"),
    ("str_format_unbound", _body('return str.format("{0.__class__}", 1)'), "runtime"),
    ("mro_walk", _body("return str.mro()"), "runtime"),
    ("builtin_self", _body('import math\nreturn getattr(math.floor, "__se" + "lf__")'), "runtime"),
    ("namespace_poison", _body("import math\nmath.floor = None\n" + OK), "runtime"),
    ("state_write", _body('state["candles"]["BTC-USD"]["5m"][0]["close"] = 0\n' + OK), "runtime"),
    ("state_append", _body('state["candles"]["BTC-USD"]["5m"].append(1)\n' + OK), "runtime"),
    ("state_top_write", _body('state["candles"] = {}\n' + OK), "runtime"),
    ("payload_write", _body('event["payload"]["price"] = 0\n' + OK), "runtime"),
    ("big_int_to_str", _body("s = str(10 ** 5000)\n" + OK), "runtime"),
    ("recursion", "def f():\n    return f()\n" + _body("f()"), "runtime"),
    ("system_exit", _body("raise SystemExit(0)"), "runtime"),
    ("keyboard_interrupt", _body("raise KeyboardInterrupt"), "runtime"),
    ("stop_iteration", _body("g = (x for x in [1])\ng.close()\nraise StopIteration"), "runtime"),
    # --- CPU and memory: the parent's deadline / the address-space limit
    ("infinite_loop", _body("while True:\n    pass"), "timeout"),
    ("bare_except_loop", _body("while True:\n    try:\n        pass\n    except:\n        pass"), "timeout"),
    ("big_int_pow", _body("x = 7 ** (7 ** 9)\n" + OK), "timeout|memory"),
    (
        "finalizer_loop",
        "def gen():\n    try:\n        yield 1\n    finally:\n        while True:\n            pass\n"
        + _body("g = gen()\nnext(g)\n" + OK),
        "timeout",
    ),
    (
        "cyclic_finalizer_after_error",
        "def gen():\n    try:\n        yield 1\n    finally:\n        while True:\n            pass\n"
        + _body("g = gen()\nnext(g)\nbox = [g]\nbox.append(box)\nraise ValueError('boom')"),
        "timeout",
    ),
    (
        "cyclic_finalizer",
        "def gen():\n    try:\n        yield 1\n    finally:\n        while True:\n            pass\n"
        + _body("g = gen()\nnext(g)\nbox = [g]\nbox.append(box)\n" + OK),
        "timeout",
    ),
    ("huge_string", _body('s = "a" * (10 ** 9)\n' + OK), "memory"),
    ("huge_list", _body("s = [0] * (10 ** 9)\n" + OK), "memory"),
    # --- output and protocol injection: captured, never on the wire
    ("print_stdout", _body('print("hello from the hook")\n' + OK), "WAKE"),
    (
        "protocol_injection",
        _body('print("\\x00\\x00\\x00\\x10\\x81\\xa4type\\xa6result", file=None)\n' + OK),
        "WAKE",
    ),
    ("print_flood", _body('for i in range(20000):\n    print("y" * 100)\n' + OK), "WAKE"),
    (
        "decimal_context_leak",
        "from decimal import localcontext\ndef gen():\n    with localcontext(prec=3):\n"
        "        yield 1\n" + _body("g = gen()\nnext(g)\nbox = [g]\nbox.append(box)\n" + OK),
        "WAKE",
    ),
    ("frame_bytes_in_reason", _body('return {"decision": "WAKE", "reason": "\\x00\\x00\\x00\\x02\\x81\\xa1"}'), "WAKE"),
    ("event_top_write", _body('event["topic"] = "hacked"\nevent["payload"] = {}\n' + OK), "WAKE"),
    (
        "exception_obj",
        _body(
            "import math\ntry:\n    math.nope\nexcept AttributeError as e:\n"
            '    return {"decision": "WAKE", "reason": str(e.obj)}'
        ),
        "WAKE",
    ),
    # --- results outside the contract
    ("trade_from_wake", _body('return {"decision": "TRADE_INTENT", "reason": "x", "intent": {}}'), "invalid_result"),
    ("nan_cooldown", _body('return {"decision": "WAKE", "reason": "x", "cooldownSeconds": float("nan")}'), "invalid_result"),
    ("set_result", _body('return {"decision": "WAKE", "reason": "x", "data": set()}'), "invalid_result"),
    ("tuple_result", _body('return {"decision": "WAKE", "reason": "x", "data": state["candles"]["BTC-USD"]["5m"]}'), "invalid_result"),
    ("proxy_result", _body("return state"), "invalid_result"),
    ("oversized_result", _body('return {"decision": "WAKE", "reason": "x" * 200000}'), "invalid_result"),
    ("surrogate_result", _body('return {"decision": "WAKE", "reason": chr(0xD800)}'), "invalid_result"),
    ("list_result", _body("return [1]"), "invalid_result"),
    ("int_overflow_result", _body('return {"decision": "WAKE", "reason": "x", "data": 2 ** 64}'), "invalid_result"),
    ("wide_chars_result", _body('return {"decision": "WAKE", "reason": chr(0x1F600) * 30000}'), "invalid_result"),
    ("wide_chars_output", _body("print(chr(0x1F600) * 20000)\n" + OK), "WAKE"),
    ("generator_result", _body("return (x for x in [1])"), "invalid_result"),
    ("missing_reason", _body('return {"decision": "WAKE"}'), "invalid_result"),
    ("unknown_decision", _body('return {"decision": "BUY", "reason": "x"}'), "invalid_result"),
    (
        "deep_result",
        _body('d = []\nfor i in range(100):\n    d = [d]\nreturn {"decision": "WAKE", "reason": "x", "data": d}'),
        "invalid_result",
    ),
]  # fmt: skip


# The reason matters too: these must fail on the policy, not on something incidental.
MESSAGES = {
    "import_os": "import of 'os' is not allowed",
    "import_operator": "import of 'operator' is not allowed",
    "import_string_formatter": "import of 'string' is not allowed",
    "import_socket": "import of 'socket' is not allowed",
    "statistics_sys": "has no attribute 'sys'",
    "datetime_sys": "has no attribute 'sys'",
    "open_builtin": "name 'open' is not defined",
    "getattr_dunder": "'__class__' is not allowed",
    "getattr_gi_frame": "'gi_frame' is not allowed",
    "str_format": "'format' is not allowed",
    "format_map": "'format_map' is not allowed",
    "mro_walk": "'mro' is not allowed",
    "namespace_poison": "TypeError",
    "state_write": "does not support item",
    "payload_write": "does not support item",
    "big_int_to_str": "4300 digits",
    "system_exit": "name 'SystemExit' is not defined",
    "class_def": "class definitions are not allowed",
    "gi_frame_walk": "forbidden to access",
    "trade_from_wake": "not allowed in wake_* hooks",
    "surrogate_result": "not valid UTF-8",
    "oversized_result": "size cap",
    "wide_chars_result": "larger than the size cap",
    "int_overflow_result": "64-bit range",
}


async def _run(pool: WorkerPool, s: Sentinels, hook_id: str, source: str) -> HookResult:
    source = source.replace("SENTINEL", str(s.file)).replace("PORT", str(s.port))
    hostile = spec_from_source(f"wake_{hook_id}", "wake", source)
    await pool.compile("victim", [hostile, CANARY])  # so only timeout_ms applies below
    results = await pool.evaluate("victim", [hostile, CANARY], EVENT, STATE)
    other = await pool.evaluate("bystander", [CANARY], EVENT, STATE)
    for canary in (results[1], other[0]):
        assert canary.decision == Wake(reason="pristine"), canary
    s.check(results + other)
    return results[0]


@pytest.mark.parametrize(("case", "source", "expected"), CASES, ids=[c[0] for c in CASES])
async def test_hostile_hook(
    pool: WorkerPool, sentinels: Sentinels, case: str, source: str, expected: str
) -> None:
    """The hostile hook ends in its expected outcome; canaries and other agents are unharmed."""
    result = await _run(pool, sentinels, case, source)
    if expected in ("WAKE", "IGNORE"):
        assert result.ok and result.decision is not None, result
        assert result.decision.name == expected
    else:
        assert result.error_kind in expected.split("|"), result
        assert result.error and len(result.error) <= pool.config.max_error_chars
        assert MESSAGES.get(case, "") in result.error


async def test_output_is_captured_and_capped(pool: WorkerPool, sentinels: Sentinels) -> None:
    """print() goes to the result's output (capped, marked), never to the IPC channel."""
    src = _body('print("hi", 1)\nfor i in range(2000):\n    print("z" * 50)\n' + OK)
    result = await _run(pool, sentinels, "print_cap", src)
    assert result.output.startswith("hi 1\nzzz")
    assert result.output.endswith("…[truncated]")
    assert len(result.output) <= pool.config.max_output_bytes + len("…[truncated]")


async def test_exception_obj_is_not_a_module(pool: WorkerPool, sentinels: Sentinels) -> None:
    """AttributeError.obj (CVE-2024-47532) carries nothing from a namespace lookup."""
    src = CASES[[c[0] for c in CASES].index("exception_obj")][1]
    result = await _run(pool, sentinels, "exception_obj2", src)
    assert result.decision == Wake(reason="None")


async def test_autotrade_may_not_wake(pool: WorkerPool, sentinels: Sentinels) -> None:
    """An autotrade hook returning WAKE is an invalid result, the canary unaffected."""
    hook = spec_from_source("autotrade_waker", "autotrade", _body(OK))
    results = await pool.evaluate("victim", [hook, CANARY], EVENT, STATE)
    assert results[0].error_kind == "invalid_result"
    assert "not allowed in autotrade_* hooks" in (results[0].error or "")
    assert results[1].ok
