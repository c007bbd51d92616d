"""``marketwake hooks ...``: test hook files in the real sandbox, resume paused hooks."""

from __future__ import annotations

import click


@click.group("hooks")
def hooks_group() -> None:
    """Work with agent hook files."""
