"""Subcommand modules of the `bertkit` CLI: each defines setup_<name>(parser) and a run function."""
