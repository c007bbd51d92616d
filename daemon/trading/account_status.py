"""A paper account as ``marketwake status`` shows it: positions at their marks,
working orders, realized and unrealized PnL, fees.

Built from the broker's own queries (the same numbers the risk engine checks),
on the broker's clock, so a replay's account reads as of its market time.
"""

from __future__ import annotations

from daemon.status import MAX_ORDERS_SHOWN, AccountStatus, PositionLine, WorkingOrderLine
from daemon.trading.broker import Broker
from daemon.trading.portfolio import Order

DAY_MS = 86_400_000


def account_status(broker: Broker, account: str, agents: list[str]) -> AccountStatus:
    """``account`` now, traded by ``agents`` (none: an account no loaded agent trades,
    e.g. a removed agent's, whose resting orders still fill)."""
    now = broker.now_ms(account)
    positions = []
    for symbol, p in sorted(broker.positions(account).items()):
        mark = broker.last_price(symbol, account)
        positions.append(
            PositionLine(
                symbol=symbol,
                quantity=p.quantity,
                avg_price=p.avg_price,
                mark=mark,
                unrealized=0.0 if mark is None else (mark - p.avg_price) * p.quantity,
                opened_ms=p.opened_ms,
            )
        )
    working = broker.open_orders(account)
    totals = broker.fill_totals(account)
    return AccountStatus(
        agents=sorted(agents),
        as_of_ms=now,
        positions=positions,
        working_orders=len(working),
        orders=[_line(o) for o in sorted(working, key=lambda o: o.created_ms)[:MAX_ORDERS_SHOWN]],
        realized=totals.realized,
        realized_today=broker.realized_pnl(account, now - now % DAY_MS),
        unrealized=sum(p.unrealized for p in positions),
        fees=totals.fees,
        fills=totals.fills,
        last_fill_ms=totals.last_ms,
    )


def _line(o: Order) -> WorkingOrderLine:
    return WorkingOrderLine(
        client_order_id=o.client_order_id,
        symbol=o.symbol,
        side=o.side,
        order_type=o.order_type,
        role=o.role,
        volume=o.volume,
        filled=o.filled,
        price=o.limit_price if o.limit_price is not None else o.stop_price,
        status=o.status,
        created_ms=o.created_ms,
    )
