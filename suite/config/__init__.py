"""The settings of a trial, in three modules:

- `schema`: the typed settings (`Literal` choices) and the frozen `Trial` with its stable id;
- `compose`: Hydra (conf/) to a `Trial`, the one way every command and test composes;
- `validate`: every problem of a trial at once, architecture-aware, and what the machine lacks.

The schema's names are re-exported here (`from suite.config import Trial`).
"""

from suite.config.schema import (
    ATTENTIONS,
    DEVICES,
    ENGINES,
    FAULTS,
    GPU_COUNTS,
    OFFLOADS,
    PRECISIONS,
    PREDICTION_ONLY,
    RECOMPUTES,
    TASKS,
    ZERO_STAGES,
    ClusterConfig,
    Config,
    DebugConfig,
    HardwareConfig,
    MeasureConfig,
    MethodsConfig,
    ModelConfig,
    RecipeConfig,
    SearchConfig,
    StoreConfig,
    Trial,
    WandbConfig,
)

__all__ = [
    "ATTENTIONS", "DEVICES", "ENGINES", "FAULTS", "GPU_COUNTS", "OFFLOADS", "PRECISIONS", "PREDICTION_ONLY",
    "RECOMPUTES", "TASKS", "ZERO_STAGES", "ClusterConfig", "Config", "DebugConfig", "HardwareConfig",
    "MeasureConfig", "MethodsConfig", "ModelConfig", "RecipeConfig", "SearchConfig", "StoreConfig", "Trial",
    "WandbConfig",
]  # fmt: skip
