"""`python -m tunefw` is the `tunefw` command."""
from tunefw.cli import main

main()
