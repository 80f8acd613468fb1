"""Horovod's elastic mode, driven by dtlaunch: which hosts exist now (`discovery.py`), which
of them may take ranks (`hosts.py`), and the job's rounds (`driver.py`)."""
