"""``marketwake run``, ``marketwake status`` and ``marketwake config check``."""

from __future__ import annotations

import time
from pathlib import Path

import click
import msgspec

from daemon import config as config_mod
from daemon.backtest.report import counted
from daemon.cli.common import echo, echo_json, resolve_state_dir, state_dir_option
from daemon.control import CONTROL_SOCKET, ask
from daemon.errors import NOT_JSON, StoreError
from daemon.events import iso_ms
from daemon.logs import configure as configure_logging
from daemon.printable import visible
from daemon.statedir import STATUS_FILE, holder
from daemon.status import Status, read_status, render_accounts
from daemon.walkeeper import FALLBACK

CONFIG_HELP = "Config file (TOML). Default: ./config.toml"


@click.command("run")
@click.option("--config", "config_path", type=click.Path(path_type=Path), help=CONFIG_HELP)
@click.option(
    "--record",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Append every bus event to this JSONL file (replayable with feeds.replay).",
)
@click.option(
    "--log-format",
    type=click.Choice(["auto", "console", "json"]),
    help="Override daemon.log_format.",
)
@click.option(
    "--from-start",
    is_flag=True,
    help="Start a replay over: forget the state caches and what the agents applied "
    "(a restarted replay otherwise resumes where it was).",
)
def run_command(
    config_path: Path | None, record: Path | None, log_format: str | None, from_start: bool
) -> None:
    """Run the daemon: every enabled feed, the bus, the state cache.

    Exits non-zero before starting anything if the config is invalid, and
    with 2 if another daemon holds the state dir. Stops on SIGTERM/SIGINT
    after draining; SIGHUP reloads the config. A restarted replay resumes
    after what the agents already applied; --from-start (or a different
    replay file) starts it over.
    """
    from daemon.app import run_daemon  # heavy imports only when running

    path = config_path or config_mod.DEFAULT_CONFIG_PATH
    cfg = config_mod.load(path)
    configure_logging(log_format or cfg.daemon.log_format, cfg.daemon.log_level)
    status = run_daemon(cfg, config_path=path, record_path=record, from_start=from_start)
    failed = [f"{f.name} ({f.error})" if f.error else f.name for f in status.feeds if f.failed]
    if failed:
        raise click.ClickException(f"feed(s) failed: {'; '.join(failed)} (see the log)")


@click.group("config")
def config_group() -> None:
    """Validate configuration files, and try the alert webhook they name."""


@config_group.command("check")
@click.argument("path", required=False, type=click.Path(path_type=Path))
def config_check(path: Path | None) -> None:
    """Check PATH (default ./config.toml) as `run` would, before anything starts.

    Decodes it (keys, types, URLs), then reads what it points at: the replay
    file, the agents directory and each agent's agent.toml and hook files.
    Every problem is printed; the exit status is 2 when there is one."""
    from daemon.preflight import check  # imports the agents' modules

    p = path or config_mod.DEFAULT_CONFIG_PATH
    cfg = config_mod.load(p)
    report = check(cfg)
    report.raise_for_problems()
    feeds = cfg.feeds
    enabled = [
        name
        for name, on in (
            ("coinbase_ws", feeds.coinbase_ws.enabled),
            ("candles", feeds.candles.enabled),
            ("replay", feeds.replay.enabled),
            ("movers", feeds.movers.enabled),
        )
        if on
    ]
    echo(f"{p}: ok")
    echo(f"  feeds: {', '.join(enabled) or 'none'}")
    echo(f"  state_dir: {cfg.daemon.state_dir}")
    if cfg.hooks.enabled:
        echo(f"  agents ({cfg.hooks.agents_dir}): {len(report.agents) or 'none'}")
        for line in report.agents:
            echo(f"    {line}")


@config_group.command("test-alert")
@click.argument("path", required=False, type=click.Path(path_type=Path))
def config_test_alert(path: Path | None) -> None:
    """Post one test alert to PATH's [hooks] alert_webhook (default ./config.toml) and
    say what the endpoint answered: try a webhook without waiting for the market.

    One attempt, 10 s at most; exit status 0 when it was delivered, 1 when not."""
    import anyio

    from daemon.alerts import Alert, WebhookNotifier, redacted, summary_line

    p = path or config_mod.DEFAULT_CONFIG_PATH
    url = config_mod.load(p).hooks.alert_webhook
    if not url:
        raise click.UsageError(f"{p} sets no [hooks] alert_webhook")
    now = time.time()
    alert = Alert(
        agent_id="marketwake",
        hook_id="test_alert",
        reason="a test alert from `marketwake config test-alert`: the webhook works",
        event_id=f"test-alert:{int(now * 1000)}",
        trace_id=f"test-alert-{int(now * 1000)}",
        ts=iso_ms(int(now * 1000)),
    )

    async def post() -> str:
        async with WebhookNotifier(url, timeout_seconds=10, retries=0) as webhook:
            delivery = await webhook.send(alert)
            return "" if delivery == "posted" else webhook.last_error

    error = anyio.run(post)
    where = redacted(url)  # its path is often its token
    if error:
        echo(f"not delivered to {where}: {visible(error)}", err=True)
        raise SystemExit(1)
    echo(f"delivered to {where}: {summary_line(alert)}")


def _render_status(st: Status, live_pid: int | None, live: bool = False) -> str:
    """``live_pid`` comes from the state dir lock: a live daemon holds it; ``live``:
    the status came from the daemon itself (the control socket), not the file."""
    age = time.time() - st.written_at
    bus = st.bus
    when = "status as of now" if live else f"status written {age:.0f}s ago"
    if live_pid is not None:
        head = f"running (pid {live_pid or st.pid}, "
    elif st.running:
        head = f"not running (pid {st.pid} ended without a clean stop; "
    elif st.interrupted:
        head = f"not running (last pid {st.pid}, stopped on request, "
    elif st.feeds and all(f.finished for f in st.feeds):
        head = f"not running (last pid {st.pid}, stopped at the end of its replay, "
    else:
        head = f"not running (last pid {st.pid}, "
    lines = [
        f"daemon: {head}{when})" + (f", run {st.run_id}" if st.run_id else ""),
        f"bus: published {bus.published}, delivered {bus.delivered}, coalesced {bus.coalesced}",
    ]
    for sub in bus.subscriptions:
        lines.append(
            f"  subscriber {sub.name}: depth {sub.depth} (max {sub.max_depth}), "
            f"delivered {sub.delivered}, lag {sub.lag_ms} ms, "
            f"blocked publishes {sub.blocked_publishes}"
        )
    for feed in st.feeds:
        state = (
            f"FAILED ({feed.error})" if feed.failed and feed.error
            else "FAILED" if feed.failed
            else "finished" if feed.finished
            else "STALLED" if feed.stalled
            else "live" if live_pid is not None
            else "stopped"  # with the daemon, before its end
        )  # fmt: skip
        lines.append(
            f"feed {feed.name}: {state}, silent {feed.silent_seconds:.1f}s, errors {feed.errors}"
        )
        flat = {k: v for k, v in feed.stats.items() if isinstance(v, (int, float, str))}
        if flat:
            lines.append("    " + ", ".join(f"{k} {v}" for k, v in flat.items()))
    lines.append(
        "state: " + ", ".join(f"{k} {v}" for k, v in st.state.items())
        if st.state
        else "state: no shared cache ([state] shared = false: each agent keeps its own)"
    )
    if st.loop is not None and st.loop.stalls:
        lp = st.loop
        lines.append(
            f"event loop: {counted(lp.stalls, 'stall')} of {lp.threshold_ms:g} ms or more "
            f"(nothing else ran meanwhile), longest {lp.longest_ms:g} ms, latest "
            f"{lp.last_ms:g} ms at {lp.last_at}"
        )
    for store, error in (st.wal.failing if st.wal is not None else {}).items():
        lines.append(f"  WAL CHECKPOINTS FAILING: {store}: {error} ({FALLBACK})")
    hooks = st.hooks
    if hooks is not None:
        health = [h for a in hooks.agents.values() for h in a.hook_health.values()]
        timeouts = sum(h.timeouts for h in health)
        errors = sum(h.errors for h in health)
        backoffs = sum(h.backoffs for h in health)
        lines.append(
            f"hooks: {hooks.evaluations} evaluations, {hooks.suppressed} suppressed, "
            f"{timeouts + errors} hook failures ({timeouts} timeouts, {errors} errors), "
            f"{backoffs} skipped in backoff, {hooks.failures} handler errors; sandbox layers: "
            + (", ".join(hooks.sandbox_layers) or "none yet")
        )
        if hooks.store_error:
            lines.append(
                f"  HOOK STORE FAILING: {hooks.store_error}: WAKE, ALERT and TRADE_INTENT "
                "decisions are suppressed (store) until it works again"
            )
        for agent, a in hooks.agents.items():
            paused = " PAUSED" if a.paused else ""
            held = f", paused hooks: {', '.join(a.paused_hooks)}" if a.paused_hooks else ""
            spend = (
                f", today {counted(a.runs_today, 'run')}, {a.tokens_in_today}+{a.tokens_out_today} tokens, "
                f"cost {a.cost_today:.4f}"
            )
            disk = f" (+{a.backlog} on disk)" if a.backlog else ""
            lines.append(
                f"  agent {agent}{paused}: {counted(len(a.hooks), 'hook')}, "
                f"queue {a.queue_depth}{disk}"
                f"{held}{spend}"
            )
            if a.runs_failing:
                lines.append(
                    f"    RUNS FAILING: the last {counted(a.runs_failing, 'run')} failed "
                    f"({a.runs_failed} since the start; last: {a.last_run_error})"
                )
            elif a.runs_failed:
                lines.append(
                    f"    {counted(a.runs_failed, 'run')} failed since the start, the latest "
                    f"run succeeded (last failure: {a.last_run_error})"
                )
            if a.lagging:
                lines.append(f"    LAGGING: {a.lagging}")
            for error in [*a.file_errors.values(), *a.compile_errors.values()]:
                lines.append(f"    NOT LOADED: {error}")  # each names its file
            for hook, h in a.hook_health.items():
                if not (h.timeouts or h.errors or h.backoffs or h.state != "ok"):
                    continue
                state = "PAUSED" if h.state == "paused" else h.state
                lines.append(
                    f"    hook {hook}: {state}, {h.evaluations} evaluations, {h.timeouts} "
                    f"timeouts, {h.errors} errors, {h.backoffs} backoffs"
                    + (f" (last: {h.last_error})" if h.last_error else "")
                )
        for agent, error in hooks.config_errors.items():
            lines.append(f"  agent {agent} NOT LOADED: {error}")
    alerts = st.alerts
    if alerts is not None and alerts.webhook:
        state = f"DOWN (last: {alerts.last_error})" if alerts.down else "up"
        lines.append(
            f"alert webhook: {state}, {alerts.posted} posted, {alerts.failed} not delivered "
            f"({alerts.retried} retries), {alerts.dropped} not posted (queue full or stopping)"
            + (
                f"; {alerts.kept} kept to post again, {alerts.reposted} posted late, "
                f"{alerts.expired} too old to post"
                if alerts.kept is not None
                else ""
            )
        )
    lines += render_accounts(st.accounts)
    return "\n".join(map(visible, lines))  # hook errors are quoted in them


@click.command("status")
@click.option("--config", "config_path", type=click.Path(path_type=Path), help=CONFIG_HELP)
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw status JSON.")
def status_command(config_path: Path | None, state_dir: Path | None, as_json: bool) -> None:
    """Show a daemon's bus, feeds, hooks and paper accounts (running, or its last run).

    A running daemon is asked over its control socket (<state_dir>/control.sock),
    so the figures are as of now; else the last status.json is read."""
    state = resolve_state_dir(config_path, state_dir)
    pid = holder(state)
    raw = ask(state / CONTROL_SOCKET, "status") if pid is not None else None
    if raw is not None:
        try:
            live = msgspec.json.decode(raw, type=Status)
        except NOT_JSON:
            live = None
        except msgspec.ValidationError:
            live = None
        if live is not None:
            if as_json:
                echo_json(msgspec.json.format(raw).decode())
            else:
                echo(_render_status(live, pid, live=True), lines=True)
            return
    try:
        status = read_status(state)
    except FileNotFoundError:
        raise click.ClickException(
            f"no status at {state / STATUS_FILE}: has the daemon run?"
        ) from None
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        echo_json(msgspec.json.format(msgspec.json.encode(status)).decode())
    else:
        echo(_render_status(status, pid), lines=True)
