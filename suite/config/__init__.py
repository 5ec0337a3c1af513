"""The settings of a trial, in three modules:

- `schema`: the typed settings (`Literal` choices) and the frozen `Trial` with its stable id;
- `compose`: Hydra (conf/) to a `Trial`, the one way every command and test composes;
- `validate`: every problem of a trial at once, architecture-aware, and what the machine lacks.

The settings most callers need are re-exported here (`from suite.config import Trial`).
"""

from suite.config.schema import ClusterConfig, Config, HardwareConfig, MethodsConfig, ModelConfig, SearchConfig, Trial

__all__ = ["ClusterConfig", "Config", "HardwareConfig", "MethodsConfig", "ModelConfig", "SearchConfig", "Trial"]
