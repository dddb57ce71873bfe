"""The `tunefw` command: thin Typer commands over the library."""
