"""Planted in a job (PYTHONPATH): rank 3 raises in its second iteration, when it asks for that
iteration's batch. ``local_cluster.py --plant failing-rank``."""
import os

if os.environ.get("RANK") == "3":
    import labkit.indexed_dataset as _data

    _get_batch = _data.get_batch

    def _planted(path, iteration, *args, **kwargs):
        if iteration == 1:
            raise RuntimeError("planted failure in iteration 2")
        return _get_batch(path, iteration, *args, **kwargs)

    _data.get_batch = _planted
