"""Stage runs on a Dask cluster: doit keeps the DAG on the client, each run goes to a worker.

The cache is the data plane, the scheduler moves keys and small records only:

- ``client``: with ``MNNBUILD_SCHEDULER=tcp://host:port`` a stage run (`RemoteTask`: its task key, the cache keys of
  the upstream dirs it reads, its params) is submitted to the scheduler; the upstream dirs are in the shared cache
  tier first (published there when only this machine has them); the client then restores the outputs from that tier
  exactly as a cache hit. Ctrl-C cancels its tasks.
- ``worker``: the function a Dask worker runs: it runs the task in a child process it kills when the task is
  cancelled (a Dask worker cannot stop a thread), and which dies with it.
- ``task``: what the child does: check that this machine computes the client's key (code, schema, MNN, QNN, inputs),
  restore the inputs from the shared cache into its scratch root (kept for its next task), run the stage's entry,
  store its outputs under that key.

It knows nothing of doit: `mnnbuild.dag.actions` calls `run_remotely` in place of the stage's entry. A stage is run
on the cluster when `runs_remotely` says so (cacheable, reads only the artifact root, no guard).
"""

from mnnbuild.cluster.client import SCHEDULER_ENV, Cluster, runs_remotely
from mnnbuild.cluster.task import RemoteTask

__all__ = ["SCHEDULER_ENV", "Cluster", "RemoteTask", "runs_remotely"]
