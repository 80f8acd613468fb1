"""What every layer shares: the error type, signals, what is open, bounded commands, private
files, text files, records.

See docs/architecture.md."""
