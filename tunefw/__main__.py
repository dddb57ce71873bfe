"""`python -m tunefw` is the `tunefw` command."""
from tunefw.cli.entry import main

main()
