"""``python -m netspec`` runs the command-line tool."""

from netspec.cli import main

main()
