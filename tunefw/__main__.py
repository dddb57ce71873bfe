"""`python -m tunefw` is the `tunefw` command."""
from tunefw.cli.app import main

main()
