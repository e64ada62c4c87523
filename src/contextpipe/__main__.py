"""``python -m contextpipe``: the ``contextpipe`` command."""

from .cli import main

main()
