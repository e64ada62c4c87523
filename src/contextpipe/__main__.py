"""``python -m contextpipe``: the ``contextpipe`` command."""

from .cli import main

if __name__ == "__main__":
    main()
