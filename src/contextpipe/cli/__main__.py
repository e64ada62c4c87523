"""``python -m contextpipe.cli``: the ``contextpipe`` command."""

from . import main

if __name__ == "__main__":
    main()
