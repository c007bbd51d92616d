"""The trade path: validated intents, the risk engine, and brokers (paper by default).

A hook's ``TRADE_INTENT`` becomes a :class:`~daemon.trading.intents.TradeIntent`,
the :class:`~daemon.trading.risk.RiskEngine` approves or rejects it with stable
reason codes, and an approved intent goes to a
:class:`~daemon.trading.broker.Broker` under a client order id derived from the
hook's ``dedupeKey`` so a retry or a restart never places it twice.
"""
