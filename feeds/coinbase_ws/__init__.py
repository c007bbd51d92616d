"""Coinbase Advanced Trade WebSocket: shared connection pool and ticker feed.

``protocol`` (sans-I/O parsing), ``pool`` (the shared connection), ``feed`` (the
ticker feed on it), ``recording`` (recorded frames). Import the module you need:
the package itself imports nothing, so reading the settings or the protocol
(preflight, a backtest) does not load the network stack.
"""
