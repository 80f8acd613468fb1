"""What a job is made of, pure: its hosts and slots, the environment its ranks get, the
command forms, CPU binding. Below the MPI families, which build a launcher's argv from them.

See docs/architecture.md."""
