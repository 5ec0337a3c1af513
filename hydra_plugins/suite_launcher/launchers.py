"""hydra-submitit-launcher's Slurm and local launchers, with each job sized by its trial.

Selected by conf/hydra/launcher/slurm.yaml and local.yaml; the behaviour is
`suite.slurm.SizedLaunch`.
"""

from hydra_plugins.hydra_submitit_launcher import submitit_launcher

from suite.slurm import SizedLaunch


class SlurmLauncher(SizedLaunch, submitit_launcher.SlurmLauncher):
    _EXECUTOR = "slurm"


class LocalLauncher(SizedLaunch, submitit_launcher.LocalLauncher):
    _EXECUTOR = "local"
