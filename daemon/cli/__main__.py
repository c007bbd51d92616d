"""``python -m daemon.cli`` is the same as the ``marketwake`` script."""

from daemon.cli.main import main

main()
