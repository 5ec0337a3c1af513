"""The suite's Hydra launchers; Hydra finds launchers only in the `hydra_plugins` package."""
