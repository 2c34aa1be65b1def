"""``python -m dualmem.cli``."""

from dualmem.cli import main

if __name__ == "__main__":
    main()
