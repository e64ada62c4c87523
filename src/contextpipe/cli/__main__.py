"""``python -m contextpipe.cli``: the ``contextpipe`` command."""

from . import main

main()
