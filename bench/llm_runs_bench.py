"""A backtest with ``--run-llm`` against a loopback model: the daemon's CPU per LLM
run, with every conversation on the one shared TLS context (as shipped) against a
fresh context per conversation (what each SDK client built before), same run.

    .venv/bin/python bench/llm_runs_bench.py [--candles 2000]

The model is an aiohttp server speaking OpenAI's Chat Completions on loopback (in
a thread of this process: its CPU is counted too, the same in both runs): each
run asks for a technical snapshot, then answers. The example agent's hooks wake
it; only the runner differs from agents/example.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from daemon.backtest.run import BacktestOptions, run_backtest
from daemon.llm import conversation
from daemon.logs import configure
from feeds.synthetic import generate_candles

ROOT = Path(__file__).resolve().parent.parent
RUNNER = """
[wake.runner]
kind = "llm"
provider = "openai"
model = "bench"
base_url = "{url}"
"""


def turn(calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None if calls else "done"}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "b", "object": "chat.completion", "created": 1, "model": "bench",
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050},
    }  # fmt: skip


async def answer(request: web.Request) -> web.Response:
    body = await request.json()
    if any(m["role"] == "assistant" for m in body["messages"]):
        return web.json_response(turn(None))
    args = json.dumps({"symbol": "BTC-USD"})
    call = {"id": "s", "type": "function",
            "function": {"name": "fetch_technical_snapshot", "arguments": args}}  # fmt: skip
    return web.json_response(turn([call]))


def serve() -> str:
    """The fake model on a loopback port, in a daemon thread; its base URL."""
    ready: list[str] = []

    def run() -> None:
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        ready.append(f"http://127.0.0.1:{runner.addresses[0][1]}/v1")
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    for _ in range(500):
        if ready:
            return ready[0]
        time.sleep(0.01)
    raise SystemExit("the fake model did not start")


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def once(tmp: Path, data: Path, url: str, label: str) -> tuple[float, float, int]:
    agent = tmp / label / "agents" / "example"
    shutil.copytree(ROOT / "agents" / "example", agent)
    toml = agent / "agent.toml"
    text = toml.read_text().replace('kind = "log"', "#", 1)
    toml.write_text(text.replace("[wake.runner]", RUNNER.format(url=url), 1))
    opts = BacktestOptions(agent_dir=agent, data=data, out=tmp / label / "out", run_llm=True)
    wall, used = time.perf_counter(), cpu()
    report = run_backtest(opts)
    return time.perf_counter() - wall, cpu() - used, report.runs


def main(n: int) -> None:
    configure("console", "error")
    url = serve()
    shared = conversation.tls_context
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        data = tmp / "c.csv"
        generate_candles(data, seed=9, n=n, timeframe="5m")
        conversation.tls_context = shared.__wrapped__  # type: ignore[assignment]
        fresh = once(tmp, data, url, "fresh")
        conversation.tls_context = shared
        kept = once(tmp, data, url, "shared")
    for name, (wall, used, runs) in (("fresh TLS context per run", fresh),
                                     ("one shared TLS context", kept)):  # fmt: skip
        print(
            f"{name}: {runs} runs in {wall:.2f}s, CPU {used:.2f}s = {1000 * used / runs:.1f} ms a run"
        )
    print(f"CPU per run, shared / fresh: {kept[1] / kept[2] / (fresh[1] / fresh[2]):.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--candles", type=int, default=2000)
    main(ap.parse_args().candles)
