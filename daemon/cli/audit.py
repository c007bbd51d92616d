"""``marketwake audit tail`` and ``marketwake why``: read the audit log."""

from __future__ import annotations

import click


@click.group("audit")
def audit_group() -> None:
    """Read the audit log of hook evaluations, wakes, risk verdicts and orders."""
