"""Agent tasks: state machine, runs, worker, runtimes, transcripts (see docs/design.md)."""
