"""The bundled job configs (YAML), installed with the package: `--config demo:<name>`."""
