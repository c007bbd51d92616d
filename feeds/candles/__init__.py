"""Coinbase public REST candles: ``protocol`` (sans-I/O), ``store`` (SQLite
high-water marks), ``poller`` (the feed). The package imports nothing itself:
the protocol is read without loading the HTTP client."""
