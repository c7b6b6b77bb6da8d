"""Sweeps: a YAML file of config values expanded into runs of ``tools/train_net.py
--eval-only``, validated, keyed, launched, resumed and recorded (behind ``tools/sweep.py``).

One module per job, in the order a sweep goes through them:

- :mod:`.sweep_file`: the sweep file format, aliases, expansion of a run's parameters;
- :mod:`.load`: reading a sweep file into runs (``load_sweep``);
- :mod:`.validate`: checking each run as the run would, before anything runs;
- :mod:`.identity`: run keys (config, data contents, code, versions, weights);
- :mod:`.lock`: one sweep per output folder (``<out>/sweep.lock``);
- :mod:`.launchers`: local runs, or submitit (Slurm / local / debug executors), Slurm job
  states from squeue, adoption of a run's live job by a later call;
- :mod:`.runner`: one run (train_net subprocess, its record, TensorBoard scalars);
- :mod:`.records`: what a record holds (metrics, config summary, errors);
- :mod:`.store`: ``results.jsonl``, appended atomically by concurrent writers;
- :mod:`.progress`: progress lines and the sweep ETA from each run's ``progress.json``;
- :mod:`.tensorboard`: a run's metrics as TensorBoard scalars;
- :mod:`.run`: ``run_sweep``, resume and counts.

The user documentation is ``docs/sweeps.md``.
"""
from .identity import ContentHashes, dataset_identity, environment_identity, run_key
from .launchers import LaunchSettings, LocalLauncher, SubmititLauncher, submitit_parameters
from .load import default_hash_cache, load_sweep, sweep_name
from .records import error_summary, planned_config
from .run import run_sweep
from .runner import RunTask, default_train_net, execute_run
from .sweep_file import ALIASES, BACKBONES, BLOCK_VARIANTS, Sweep, SweepRun, expand_params, load_base_config, \
    merge_run_config
from .store import append_jsonl, finished_keys, read_jsonl
from .validate import SweepValidationError, validate_config

__all__ = ["ALIASES", "BACKBONES", "BLOCK_VARIANTS", "Sweep", "SweepRun", "SweepValidationError", "load_sweep",
           "sweep_name", "default_hash_cache", "expand_params", "merge_run_config", "load_base_config",
           "validate_config", "dataset_identity", "environment_identity", "run_key", "ContentHashes", "read_jsonl",
           "append_jsonl", "finished_keys", "run_sweep", "default_train_net", "execute_run", "RunTask",
           "LaunchSettings", "LocalLauncher", "SubmititLauncher", "submitit_parameters", "error_summary",
           "planned_config"]
