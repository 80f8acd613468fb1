"""Horovod's Gloo controller: dtlaunch starts every rank itself and runs the job's rendezvous."""
