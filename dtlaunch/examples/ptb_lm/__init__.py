"""Penn Treebank word-level LSTM language model (Zaremba et al. 2014), distributed with Horovod.

Run ``python -m dtlaunch.examples.ptb_lm --config small`` (one process) or under
``mpirun``/``horovodrun``/``dtlaunch`` for several ranks; see ``train.py`` for the options.
"""
