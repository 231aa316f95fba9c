"""Checkpoints and the run directory: everything that saves a run and brings it back.

    files.py         one checkpoint on disk: the atomic write, reading it back (safetensors,
                     weights_only), pruning old ones, cleaning up after interrupted saves
    state.py         TrainState: what a run carries from step to step besides the weights and
                     the optimizer (counters, data position, loss guard, budget, newest
                     checkpoint); Window, the steps since the last metrics record
    save_restore.py  Checkpointer: saves a TrainState with the weights and optimizer state,
                     restores it on resume and rollback; the run directory's session (lock)
    resume.py        which checkpoint a run resumes from, and which config changes it may make
    writer.py        background saves (checkpoint.async_save): the state staged to host memory
                     at the step boundary, written on a thread while training goes on
    rundir.py        what may be a run directory, and one trainer per directory (RunLock)

The names of checkpoint directories and finding the newest complete one are
littlelm/checkpoint_dirs.py, in the bottom layer, because every layer needs them (a saved
tokenizer read from a run directory, `eval`, `sample`); files.py re-exports them, so loading a
checkpoint needs files.py alone (`from littlelm.train.checkpoint import files as ckpt`).
"""
