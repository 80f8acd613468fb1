"""Horovod's elastic mode: which hosts exist, which may take ranks, and the job's rounds."""
