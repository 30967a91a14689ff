"""Agent tasks: state machine, runs, worker, runtimes, transcripts (see DESIGN.md)."""
