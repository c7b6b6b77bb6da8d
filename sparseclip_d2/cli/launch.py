"""train_net's process launch: detectron2's ``launch`` where there are GPUs, and one gloo
process per machine where there are none.

detectron2 0.6's ``launch`` (``detectron2/engine/launch.py``) spawns one process per GPU,
asserts that CUDA is available in each and joins them with NCCL. A run of several processes
on CPU-only machines (a Slurm job of several tasks, ``--num-machines M``, each task one
train_net process) therefore needs its own start: :func:`launch_cpu_processes` joins the
``M`` processes in a gloo process group (``torch.distributed.init_process_group``) and sets
the one detectron2 state that its ``launch`` sets besides the default group, the group of the
processes on the same machine (``comm._LOCAL_PROCESS_GROUP``, which ``detectron2.utils.comm``
documents as set by the launcher; here each machine has one process). Everything else
(``comm.get_rank``, ``comm.gather``, the ``InferenceSampler`` shards) is detectron2's, as
with GPUs.
"""
import logging
from datetime import timedelta

import torch
import torch.distributed as dist

from sparseclip_d2.common.logs import quiet_library_imports

with quiet_library_imports():
    from detectron2.engine import launch as detectron2_launch
    from detectron2.utils import comm

__all__ = ["launch", "launch_cpu_processes", "DEFAULT_TIMEOUT"]

logger = logging.getLogger(__name__)

#: as detectron2's launch (detectron2/engine/launch.py DEFAULT_TIMEOUT, detectron2 0.6)
DEFAULT_TIMEOUT = timedelta(minutes=30)


def launch(main_func, num_gpus_per_machine: int, num_machines: int = 1, machine_rank: int = 0, dist_url=None,
           args=(), timeout: timedelta = DEFAULT_TIMEOUT):
    """``main_func(*args)`` in one process, in ``num_gpus_per_machine`` GPU processes per
    machine (detectron2's ``launch``), or, on a machine without CUDA and ``num_machines > 1``,
    in this process as rank ``machine_rank`` of a gloo group of ``num_machines`` processes
    (:func:`launch_cpu_processes`)."""
    if num_machines > 1 and not torch.cuda.is_available():
        if num_gpus_per_machine > 1:
            raise ValueError(f"--num-gpus {num_gpus_per_machine} with --num-machines {num_machines} on a machine "
                             "without CUDA: a CPU run has one process per machine (--num-gpus 1)")
        return launch_cpu_processes(main_func, num_machines, machine_rank, dist_url, args=args, timeout=timeout)
    return detectron2_launch(main_func, num_gpus_per_machine, num_machines=num_machines, machine_rank=machine_rank,
                             dist_url=dist_url, args=args, timeout=timeout)


def launch_cpu_processes(main_func, world_size: int, rank: int, dist_url: str, args=(),
                         timeout: timedelta = DEFAULT_TIMEOUT):
    """Run ``main_func(*args)`` as rank ``rank`` of ``world_size`` CPU processes (one per
    machine) joined by gloo at ``dist_url`` (``tcp://host:port``, rank 0's address, or
    ``file://``). The group is torn down when ``main_func`` returns or raises; on success all
    ranks pass a barrier first, so none tears it down while another still uses it."""
    if not dist_url or dist_url == "auto":
        raise ValueError(f"--num-machines {world_size} needs --dist-url tcp://<host of machine rank 0>:<port> "
                         f"(got {dist_url!r})")
    if not 0 <= rank < world_size:
        raise ValueError(f"--machine-rank {rank} is not in 0..{world_size - 1} (--num-machines {world_size})")
    if dist.is_initialized():
        raise RuntimeError("a torch.distributed process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=dist_url, world_size=world_size, rank=rank, timeout=timeout)
    try:
        # every rank creates every group (torch.distributed.new_group's rule); this process's
        # machine-local group holds itself alone
        local_groups = [dist.new_group([r]) for r in range(world_size)]
        comm._LOCAL_PROCESS_GROUP = local_groups[rank]
        comm.synchronize()
        result = main_func(*args)
        comm.synchronize()
        return result
    finally:
        comm._LOCAL_PROCESS_GROUP = None
        dist.destroy_process_group()
