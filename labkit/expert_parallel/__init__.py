"""Expert parallelism (chapter "Expert parallelism"): the all-to-all pair so far (ep_comm.py)."""
