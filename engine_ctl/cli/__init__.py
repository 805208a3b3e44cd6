"""The command line: click commands that parse, call the core and the shell, and print."""
