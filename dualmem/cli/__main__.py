"""``python -m dualmem.cli``."""

from dualmem.cli import main

main()
