"""train_net's CPU launch (``sparseclip_d2.cli.launch``): several processes, one per machine,
joined with gloo, with detectron2's ``comm`` answering as under its own ``launch``."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORKER = """
import json, sys
import torch
torch.cuda.is_available = lambda: False  # a GPU machine too takes the CPU path in this test
from detectron2.utils import comm
from sparseclip_d2.cli.launch import launch

def main(tag):
    return comm.get_rank(), comm.get_world_size(), comm.get_local_rank(), comm.get_local_size(), \\
        comm.all_gather((tag, comm.get_rank() * 10)), comm.is_main_process()

rank, url, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
result = launch(main, 1, num_machines=2, machine_rank=rank, dist_url=url, args=(f"r{rank}",))
assert not torch.distributed.is_initialized() and comm._LOCAL_PROCESS_GROUP is None  # torn down
with open(out, "w") as f:
    json.dump(result, f)
"""


def test_two_cpu_processes_join_with_gloo_and_see_detectron2_ranks(tmp_path):
    url = f"file://{tmp_path / 'rendezvous'}"
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), url, str(tmp_path / f"r{r}.json")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    got = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in (0, 1)]
    gathered = [["r0", 0], ["r1", 10]]
    assert got == [[0, 2, 0, 1, gathered, True], [1, 2, 0, 1, gathered, False]]


def test_cpu_launch_refuses_what_it_cannot_run():
    from sparseclip_d2.cli.launch import launch_cpu_processes

    with pytest.raises(ValueError, match=r"--num-machines 2 needs --dist-url tcp://<host of machine rank 0>:<port> "
                                         r"\(got 'auto'\)"):
        launch_cpu_processes(print, 2, 0, "auto")
    with pytest.raises(ValueError, match=r"--machine-rank 2 is not in 0\.\.1 \(--num-machines 2\)"):
        launch_cpu_processes(print, 2, 2, "tcp://127.0.0.1:1")
