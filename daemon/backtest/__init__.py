"""Backtests: an agent through the real pipeline over history, with a cost report."""
