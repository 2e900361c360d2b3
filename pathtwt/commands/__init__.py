"""One module per ``pathtwt`` subcommand (see pathtwt/cli.py for the contract)."""
